//! RQ has no Redis Cluster support.

use crate::common::layouts::assert_a_cluster_url_is_refused;
use jobrelay::LayoutKind;

/// A Cluster URL in the rq layout is refused at start, one line naming --layout and the
/// layout, exit 2, before anything connects.
#[tokio::test]
async fn the_rq_layout_refuses_a_cluster_url() {
    assert_a_cluster_url_is_refused(LayoutKind::Rq).await;
}
