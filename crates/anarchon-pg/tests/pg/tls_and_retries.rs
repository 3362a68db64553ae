//! TLS and batch retries.

use super::*;

/// With the `tls` feature, `sslmode=require` in the URL encrypts every
/// connection of the store (the server's own view in `pg_stat_ssl`).
#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_connections_are_encrypted() {
    let factory = PgFactory::new().await;
    let sep = if factory.url().contains('?') {
        '&'
    } else {
        '?'
    };
    let app = unique_prefix("anarchon_tls_");
    let store = factory
        .store_with(
            PgOptions::new(format!("{}{sep}sslmode=require", factory.url()))
                .with_table_name(factory.table().clone())
                .with_application_name(&app),
        )
        .await;
    first_claim_is_won(&store, "tls", "claim over TLS").await;
    let mut conn = admin(factory.url()).await;
    let ssl: Vec<bool> = sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_ssl AS s JOIN pg_stat_activity AS a USING (pid) WHERE a.application_name = $1",
    )
    .bind(&app)
    .fetch_all(&mut conn)
    .await
    .expect("pg_stat_ssl");
    assert!(!ssl.is_empty(), "the store has a session");
    assert!(
        ssl.iter().all(|s| *s),
        "every session is encrypted: {ssl:?}"
    );
}

/// `store` wins the first claim of a run of `name` ahead of now; `what`
/// says over which connection, should the claim fail.
#[cfg(feature = "tls")]
async fn first_claim_is_won(store: &(impl LeaseStore + ?Sized), name: &str, what: &str) {
    let run = RunKey::new(job(name), Slot::from_millis(future_base()));
    won(store
        .claim_lease(&claim(run, Token::generate(), "a", Overlap::Allow))
        .await
        .expect(what));
}

/// The PostgreSQL server behind a TLS terminator with its own authority,
/// and a URL to it without `sslmode`.
#[cfg(feature = "tls")]
async fn behind_tls(factory: &PgFactory) -> (anarchon_testkit::TlsTerminator, String) {
    let parsed: PgConnectOptions = factory.url().parse().expect("test URL");
    let upstream = format!("{}:{}", parsed.get_host(), parsed.get_port());
    let terminator =
        anarchon_testkit::TlsTerminator::start(upstream, anarchon_testkit::Handshake::Postgres)
            .await
            .expect("TLS terminator");
    let user = parsed.get_username();
    let database = parsed.get_database().unwrap_or("test");
    let url = format!(
        "postgres://{user}@localhost:{}/{database}",
        terminator.port()
    );
    (terminator, url)
}

/// `sslmode=verify-full` with `sslrootcert` naming the authority that
/// signed the server's certificate: the store connects over TLS and claims.
#[cfg(feature = "tls")]
#[tokio::test]
async fn verify_full_connects_with_the_servers_authority() {
    let factory = PgFactory::new().await;
    let (terminator, url) = behind_tls(&factory).await;
    let store = factory
        .store_with(
            PgOptions::new(format!(
                "{url}?sslmode=verify-full&sslrootcert={}",
                terminator.ca_file().display()
            ))
            .with_table_name(factory.table().clone()),
        )
        .await;
    first_claim_is_won(&store, "verified", "claim over verified TLS").await;
    assert!(terminator.handshakes() >= 1);
    assert_eq!(terminator.refused_handshakes(), 0);
}

/// A server certificate signed by an authority the client was not told
/// about is refused under `verify-full` (and `verify-ca`): the store does
/// not open, and the error says it was the certificate.
#[cfg(feature = "tls")]
#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let factory = PgFactory::new().await;
    let (terminator, url) = behind_tls(&factory).await;
    for mode in ["verify-full", "verify-ca"] {
        let error = PgStore::connect_with(
            PgOptions::new(format!("{url}?sslmode={mode}"))
                .with_table_name(factory.table().clone())
                .with_connect_timeout(Duration::from_secs(5)),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("sslmode={mode} must refuse an unknown authority"));
        let message = error.to_string();
        assert!(
            message.to_lowercase().contains("certificate"),
            "sslmode={mode}: the error names the certificate: {message}"
        );
    }
    assert_eq!(terminator.handshakes(), 0, "no handshake may complete");
    // The terminator notices the client's alert a moment after the client
    // gave up.
    let start = Instant::now();
    while terminator.refused_handshakes() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the terminator saw {} refused handshakes",
            terminator.refused_handshakes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A batch sent again with the same tokens (after a lost reply) gets the
/// same answers: the same wins with the same attempts and fences, and the
/// same lease ends for runs others hold. Only the store's clock in a
/// `Running` answer moves on.
#[tokio::test]
async fn a_retried_batch_gets_the_same_answers() {
    let factory = PgFactory::new().await;
    let a = factory.instance().await;
    let b = factory.instance().await;
    let slot = Slot::from_millis(future_base());
    let claims: Vec<LeaseClaim> = (0..30)
        .map(|i| {
            claim(
                RunKey::new(job(&format!("retry-{i}")), slot),
                Token::generate(),
                "a",
                Overlap::Allow,
            )
        })
        .collect();
    for c in claims.iter().step_by(3) {
        won(b
            .claim_lease(&claim(
                c.run().clone(),
                Token::generate(),
                "b",
                Overlap::Allow,
            ))
            .await
            .expect("claim"));
    }
    let first = anarchon_testkit::fleet::outcomes_of_a_batch(&*a, &claims).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = anarchon_testkit::fleet::outcomes_of_a_batch(&*a, &claims).await;
    anarchon_testkit::fleet::assert_same_outcomes_but_for_the_store_clock(&first, &again);
    assert_eq!(
        first
            .iter()
            .filter(|o| matches!(o, ClaimOutcome::Running { .. }))
            .count(),
        10
    );
}

/// One batch, two jobs; one job's row holds a fence the store cannot read
/// back (a hand edit made it negative). The function commits both claims;
/// the sound job's answer is a win that stands, and the broken one's claim
/// alone gets an error naming the run (the scheduler then releases it).
#[tokio::test]
async fn one_jobs_unreadable_answer_costs_its_batch_nothing() {
    let factory = PgFactory::new().await;
    let store = factory.instance().await;
    let table = factory.table().clone();
    let mut conn = admin(factory.url()).await;
    exec(
        &mut conn,
        format!(r#"INSERT INTO "{table}_jobs" (job, last_fence) VALUES ('negative-fence', -5)"#),
    )
    .await;
    let slot = Slot::from_millis(future_base());
    let broken = RunKey::new(job("negative-fence"), slot);
    let batch = [
        claim(broken.clone(), Token::generate(), "a", Overlap::Allow),
        claim(
            RunKey::new(job("sound"), slot),
            Token::generate(),
            "a",
            Overlap::Allow,
        ),
    ];
    let answers = anarchon_testkit::fleet::answers_to_a_batch(&*store, &batch).await;
    let err = answers[0].as_ref().expect_err("an unreadable fence");
    assert!(
        err.to_string().contains(&broken.to_string()) && err.to_string().contains("negative"),
        "the run and the problem are named: {err}"
    );
    assert!(
        matches!(answers[1], Ok(ClaimOutcome::Won(_))),
        "the sound job's claim: {:?}",
        answers[1]
    );
    // The broken claim was committed under its token: a release hands it on.
    assert_eq!(
        store.release(&broken, batch[0].claim.token).await.unwrap(),
        Renewal::Renewed
    );
}
