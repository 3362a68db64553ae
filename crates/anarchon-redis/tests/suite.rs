//! The conformance suites against the test Redis: every strategy runs the
//! claim suite, `lease` also the lease suite. Each test gets its own key
//! prefix, and each simulated instance its own store and pool.

#![allow(clippy::unwrap_used)]

mod common;

mod lease_claims {
    anarchon_testkit::claim_suite!(crate::common::LeaseFactory::new().await);
}

mod lease_leases {
    anarchon_testkit::lease_suite!(crate::common::LeaseFactory::new().await);
}

mod stream_id_claims {
    anarchon_testkit::claim_suite!(crate::common::StreamIdFactory::new().await);
}

mod script_claims {
    anarchon_testkit::claim_suite!(crate::common::ScriptFactory::new().await);
}

/// The claim suite on the `idmp` strategy. It needs Redis 8.6 or newer
/// and fails, saying so, on an older server; `cargo xtask test-all` leaves
/// it out there (`--skip idmp_claims::`) and reports "redis idmp NOT
/// TESTED" in its summary.
mod idmp_claims {
    anarchon_testkit::claim_suite!(crate::common::idmp_factory().await);
}

/// The idmp store refuses a server without `XADD ... IDMP`, naming the
/// strategy to use instead: the test server itself when it is older than
/// 8.6, or the test server seen through a proxy that makes it report
/// version 7.
#[tokio::test]
async fn the_idmp_strategy_refuses_a_server_without_xadd_idmp() {
    use anarchon_redis::{Error, RedisIdmpStore, RedisOptions};
    let url = common::url().await;
    let (product, version) = common::server_version(&url).await;
    let proxy = common::proxy::Proxy::start(&url).await;
    let shown = version.to_string();
    let older: String = shown
        .chars()
        .enumerate()
        .map(|(i, c)| match (i, c) {
            (0, _) => '7',
            (_, '.') => '.',
            _ => '0',
        })
        .collect();
    if product == "Redis" && version >= anarchon_redis::IDMP_MIN_VERSION {
        proxy.rewrite(
            &format!("redis_version:{shown}"),
            &format!("redis_version:{older}"),
        );
    }
    let prefix = anarchon_testkit::unique_prefix("idmp-refusal");
    let _cleanup = common::Cleanup::new(&url, &prefix);
    let opts = RedisOptions::new(proxy.url(&url))
        .with_prefix(&prefix)
        .unwrap();
    let err = RedisIdmpStore::connect(&opts, RedisIdmpStore::DEFAULT_DURATION)
        .await
        .expect_err("the idmp strategy must refuse a server without XADD IDMP");
    assert!(
        matches!(
            err,
            Error::ServerTooOld {
                strategy: "idmp",
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("`script` strategy"), "{message}");
}
