//! kombu's Redis transport has no Cluster support.

use crate::common::layouts::assert_a_cluster_url_is_refused;
use jobrelay::LayoutKind;

/// A Cluster URL in the celery layout is refused at start, one line naming --layout, exit 2,
/// before anything connects.
#[tokio::test]
async fn the_celery_layout_refuses_a_cluster_url() {
    assert_a_cluster_url_is_refused(LayoutKind::Celery).await;
}
