//! Refused input, unreachable and lying servers.

use super::*;

/// Table names that are not plain identifiers (or are too long) and bad
/// options are refused before anything is sent: a listener standing in for
/// the server never sees a connection.
#[tokio::test]
async fn bad_table_names_are_refused_before_any_sql() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let url = format!("postgres://postgres:pw@127.0.0.1:{port}/test");
    let too_long = "a".repeat(anarchon_pg::MAX_TABLE_NAME_LEN + 1);
    for bad in [
        "",
        "Runs",
        "runs-table",
        "runs table",
        "1runs",
        r#"runs"; DROP TABLE anarchon; --"#,
        "public.runs",
        "rüns",
        too_long.as_str(),
    ] {
        match PgOptions::new(&url).with_table(bad) {
            Err(Error::InvalidTableName { .. }) => {}
            other => panic!("{bad:?} must be refused, got {other:?}"),
        }
        assert!(TableName::new(bad).is_err());
    }
    for options in [
        PgOptions::new(&url).with_pool_size(0),
        PgOptions::new(&url).with_connect_timeout(Duration::ZERO),
    ] {
        let err = PgStore::connect_with(options)
            .await
            .expect_err("bad option");
        assert!(matches!(err, Error::InvalidOption { .. }), "{err}");
    }
    let err = PgStore::connect_with(PgOptions::new("postgres://u@h:notaport/db"))
        .await
        .expect_err("bad URL");
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err}");
    let connected = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(
        connected.is_err(),
        "nothing may connect before the input is checked"
    );
}

/// A server that accepts the connection and never answers: opening fails as
/// unavailable (temporary) once the connect timeout has passed, not later.
#[tokio::test]
async fn an_unresponsive_server_is_unavailable_within_the_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    let server = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            keep.lock().expect("lock").push(socket);
        }
    });
    let timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = PgStore::connect_with(
        PgOptions::new(format!(
            "postgres://postgres@127.0.0.1:{port}/test?sslmode=disable"
        ))
        .with_connect_timeout(timeout),
    )
    .await
    .expect_err("no answer");
    let took = started.elapsed();
    server.abort();
    assert!(err.is_temporary(), "{err}");
    let store_err = StoreError::from(err);
    assert_eq!(store_err.kind(), StoreErrorKind::Unavailable);
    assert!(took >= timeout, "it waited the timeout: {took:?}");
    assert!(
        took < timeout + Duration::from_secs(3),
        "it gave up at the timeout, not much later: {took:?}"
    );
    assert!(
        !held.lock().expect("lock").is_empty(),
        "the client did reach the silent server"
    );
}

/// Nothing listens on the port: unavailable, and the message never shows
/// the password of the URL, through any of the ways an error is printed.
#[tokio::test]
async fn a_refused_connection_is_unavailable_without_the_password() {
    const SENTINEL: &str = "Sentinel-Secret-4242";
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    let options = PgOptions::new(format!(
        "postgres://postgres:{SENTINEL}@127.0.0.1:{port}/test"
    ))
    .with_connect_timeout(Duration::from_secs(2));
    assert!(!format!("{options:?}").contains(SENTINEL));
    let err = PgStore::connect_with(options).await.expect_err("refused");
    assert!(err.is_temporary(), "{err}");
    assert_no_secret(err, SENTINEL);
}

/// A server that asks for the password and refuses it (as PostgreSQL does
/// for a wrong one): the error is invalid configuration, says that
/// authentication failed, and never contains the password — which the
/// server did receive.
#[tokio::test]
async fn a_wrong_password_is_refused_without_showing_it() {
    const SENTINEL: &str = "Sentinel-Secret-4343";
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        // Startup message: length, then the rest.
        let len = socket.read_i32().await.expect("startup length");
        let mut startup = vec![0; usize::try_from(len - 4).expect("length")];
        socket.read_exact(&mut startup).await.expect("startup");
        // AuthenticationCleartextPassword.
        socket
            .write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3])
            .await
            .expect("auth request");
        let tag = socket.read_u8().await.expect("password tag");
        assert_eq!(tag, b'p');
        let len = socket.read_i32().await.expect("password length");
        let mut password = vec![0; usize::try_from(len - 4).expect("length")];
        socket.read_exact(&mut password).await.expect("password");
        // ErrorResponse, as PostgreSQL sends it for a wrong password.
        let mut fields = Vec::new();
        for (code, value) in [
            (b'S', "FATAL"),
            (b'V', "FATAL"),
            (b'C', "28P01"),
            (b'M', "password authentication failed for user \"postgres\""),
        ] {
            fields.push(code);
            fields.extend_from_slice(value.as_bytes());
            fields.push(0);
        }
        fields.push(0);
        let mut msg = vec![b'E'];
        msg.extend_from_slice(&(i32::try_from(fields.len() + 4).expect("len")).to_be_bytes());
        msg.extend_from_slice(&fields);
        socket.write_all(&msg).await.expect("error response");
        socket.flush().await.expect("flush");
        String::from_utf8_lossy(&password).into_owned()
    });
    let err = PgStore::connect_with(
        PgOptions::new(format!(
            "postgres://postgres:{SENTINEL}@127.0.0.1:{port}/test?sslmode=disable"
        ))
        .with_connect_timeout(Duration::from_secs(5)),
    )
    .await
    .expect_err("wrong password");
    let received = server.await.expect("fake server");
    assert!(
        received.contains(SENTINEL),
        "the password was sent to the server"
    );
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    let shown = err.to_string();
    assert!(shown.contains("password authentication failed"), "{shown}");
    assert!(shown.contains("28P01"), "{shown}");
    assert_no_secret(err, SENTINEL);
}

/// A database that does not exist on the real server: invalid
/// configuration, and the URL's password appears nowhere.
#[tokio::test]
async fn a_missing_database_is_refused_without_the_password() {
    const SENTINEL: &str = "Sentinel-Secret-4444";
    let (host, port, user) = server_parts().await;
    let database = unique_prefix("anarchon_no_such_db_");
    let err = PgStore::connect_with(PgOptions::new(format!(
        "postgres://{user}:{SENTINEL}@{host}:{port}/{database}"
    )))
    .await
    .expect_err("missing database");
    assert_eq!(err.kind(), StoreErrorKind::Invalid, "{err}");
    let shown = err.to_string();
    // A trust-auth server answers "no such database"; one that checks
    // passwords refuses the sentinel first. Either way: invalid.
    assert!(
        shown.contains("3D000") || shown.contains("28P01"),
        "{shown}"
    );
    assert_no_secret(err, SENTINEL);
}

fn assert_no_secret(err: Error, secret: &str) {
    let mut shown = vec![format!("{err}"), format!("{err:?}")];
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        shown.push(format!("{s} {s:?}"));
        source = s.source();
    }
    let store = StoreError::from(err);
    shown.push(format!("{store}"));
    shown.push(format!("{store:?}"));
    for text in shown {
        assert!(!text.contains(secret), "the password leaked: {text}");
    }
}
