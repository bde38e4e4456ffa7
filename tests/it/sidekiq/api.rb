# What Sidekiq's API says, as one line of JSON: the queues and their sizes, the jobs enqueued,
# the size of the scheduled set and the times of its jobs with the args "scheduled", ..., and
# the job JID in the queue QUEUE.
j = Sidekiq::Queue.new(QUEUE).find_job(JID)
s = Sidekiq::ScheduledSet.new
puts JSON.generate({
  "queues" => Sidekiq::Queue.all.map { |q| [q.name, q.size] },
  "enqueued" => Sidekiq::Stats.new.enqueued,
  "scheduled" => s.size,
  "at" => s.select { |e| e.args[0] == "scheduled" }.map { |e| e.at.to_f }.uniq,
  "job" => { "jid" => j.jid, "class" => j.klass, "args" => j.args, "queue" => j["queue"],
             "enqueued_at" => j.enqueued_at.to_f, "created_at" => j.created_at.to_f }
})
