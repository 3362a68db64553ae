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

/// On Redis 8.6+ these run the claim suite on the `idmp` strategy; on an
/// older server each checks that the store refuses the server instead.
mod idmp_claims {
    anarchon_testkit::claim_suite!(match crate::common::idmp_factory_or_refusal(module_path!())
        .await
    {
        Some(factory) => factory,
        None => return,
    });
}
