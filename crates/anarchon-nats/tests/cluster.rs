//! The claim and lease suites against the three-node NATS JetStream
//! cluster (`ANARCHON_NATS_CLUSTER_URL`, or the one `cargo xtask services
//! --start` runs on 127.0.0.1:4231-4233), with three replicas: every
//! stream and bucket is a Raft group across the three nodes, and every
//! claim is acknowledged only once a majority stored it. Each test has its
//! own stream or bucket, deleted afterwards; every simulated instance has
//! its own connection to the seed node, and the client learns the other
//! nodes from it.

mod common;

/// The claim store (JetStream de-duplication) on a stream with three
/// replicas.
mod claims {
    anarchon_testkit::claim_suite!(
        crate::common::NatsFactory::on_cluster()
            .await
            .with_call_limit(crate::common::CLUSTER_CALL_LIMIT)
    );
}

/// The KV lease store on a bucket with three replicas.
mod kv_leases {
    anarchon_testkit::lease_suite!(
        crate::common::NatsLeaseFactory::on_cluster()
            .await
            .with_call_limit(crate::common::CLUSTER_CALL_LIMIT)
    );
}

/// The streams really are replicated: a store's stream and a lease
/// store's bucket on the cluster have three replicas, a leader and two
/// current followers, each on its own node.
#[tokio::test]
async fn streams_on_the_cluster_have_three_replicas() {
    use anarchon_testkit::StoreFactory;
    let claims = common::NatsFactory::on_cluster().await;
    let store = claims.instance().await;
    let leases = common::NatsLeaseFactory::on_cluster().await;
    let _lease_store = leases.instance().await;
    let client = async_nats::connect(common::cluster_url().await.as_str())
        .await
        .expect("the cluster answers");
    let jetstream = async_nats::jetstream::new(client);
    for stream in [store.stream_name().to_owned(), leases.leases.stream_name()] {
        let mut stream = jetstream.get_stream(&stream).await.expect("the stream");
        let info = stream.info().await.expect("its info");
        assert_eq!(info.config.num_replicas, common::CLUSTER_REPLICAS);
        let cluster = info.cluster.clone().expect("cluster info");
        let leader = cluster.leader.clone().expect("a leader");
        let mut nodes: Vec<String> = cluster.replicas.iter().map(|r| r.name.clone()).collect();
        nodes.push(leader);
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), 3, "three nodes hold it: {cluster:?}");
    }
}
