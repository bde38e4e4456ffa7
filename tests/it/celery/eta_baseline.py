# 20 tasks named TASK that celery's own client sends with the ETA DUE (epoch seconds), over the
# queues a b c d; prints their ids.
import datetime
from app import app
eta = datetime.datetime.fromtimestamp(DUE, datetime.timezone.utc)
for i in range(20):
    print(app.tasks[TASK].apply_async(args=['baseline', i], queue='abcd'[i % 4], eta=eta).id)
