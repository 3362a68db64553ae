//! Reading store URLs: what the backends' URL readers share.

/// `text` with its `%XX` escapes decoded; `None` for a broken escape
/// (fewer than two hexadecimal digits after `%`) or a result that is not
/// UTF-8. `+` is left as it is: store URLs are not form data.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Words that mark a query parameter's value as a secret (`password=`,
/// `token=`, `nkey_seed=`, …), compared case-insensitively.
const SECRET_WORDS: [&str; 7] = ["pass", "token", "secret", "key", "cred", "jwt", "seed"];

/// Characters that break a URL's structure when they appear unescaped in
/// a user name or password: parsers then cut the secret in pieces and
/// quote the pieces in their errors. (A `%` that starts no valid escape
/// does too; see [`breaks_structure`].)
const STRUCTURAL: [char; 6] = ['/', '?', '#', '@', '[', ']'];

/// Whether `part` of a user info cannot be read as written: a structural
/// character, white space, or a `%` that starts no valid escape.
fn breaks_structure(part: &str) -> bool {
    part.contains(STRUCTURAL)
        || part.contains(char::is_whitespace)
        || percent_decode(part).is_none()
}

/// Schemes whose clients read a lone user info (`scheme://name@host`) as a
/// user name, which is shown; the others (Redis, NATS) read it as a
/// password or token, which is hidden.
const LONE_USER_IS_A_NAME: [&str; 4] = ["postgres", "postgresql", "amqp", "amqps"];

/// The user info of `url`: everything between `://` (or the start, for a
/// URL without a scheme) and the last `@` (a password with an unescaped
/// `/`, `?`, `#` or `@` stays inside it). `(scheme, user info, the rest)`.
fn user_info(url: &str) -> Option<(Option<&str>, &str, &str)> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let at = rest.rfind('@')?;
    Some((scheme, &rest[..at], &rest[at + 1..]))
}

/// `url` with its secrets replaced by `***`: the whole user info but the
/// user name (`scheme://user:***@host…`; a lone user info, which some
/// clients read as a password or token, becomes `***`), and the value of
/// every query parameter whose name speaks of a secret.
pub fn redact(url: &str) -> String {
    let (head, tail) = match user_info(url) {
        Some((scheme, info, after)) => {
            let lone_name = scheme.is_some_and(|s| LONE_USER_IS_A_NAME.contains(&s));
            let hidden = match info.split_once(':') {
                Some((user, _)) if !user.contains(STRUCTURAL) => format!("{user}:***"),
                None if lone_name && !info.contains(STRUCTURAL) => info.to_owned(),
                _ => "***".to_owned(),
            };
            let scheme = scheme.map(|s| format!("{s}://")).unwrap_or_default();
            (format!("{scheme}{hidden}@"), after)
        }
        None => (String::new(), url),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let params: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _))
                        if SECRET_WORDS
                            .iter()
                            .any(|w| name.to_ascii_lowercase().contains(w)) =>
                    {
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            let mut out = format!("{path}?{}", params.join("&"));
            if let Some(fragment) = fragment {
                out.push('#');
                out.push_str(fragment);
            }
            out
        }
        None => tail.to_owned(),
    };
    format!("{head}{tail}")
}

/// The hint to give instead of reading `url`, when its user info holds a
/// password (a `:`) and, up to the last `@`, a character that breaks URL
/// structure: a parser would split the password and take pieces of it for
/// the host, the path or the query, and show them. `None` when the URL can
/// be read as written.
pub fn ambiguous_user_info(url: &str) -> Option<String> {
    let (scheme, info, _) = user_info(url)?;
    (info.contains(':') && cuts_the_secret(info))
        .then(|| unreadable_hint(scheme.unwrap_or("store")))
}

/// Whether a parser would cut the secret of user info `info` (a password
/// after the first `:`, or the whole of a lone user info) in pieces.
fn cuts_the_secret(info: &str) -> bool {
    let (user, secret) = info.split_once(':').unwrap_or(("", info));
    breaks_structure(secret) || breaks_structure(user)
}

fn unreadable_hint(scheme: &str) -> String {
    format!(
        "the {scheme}:// URL could not be read (it is not shown: it holds a password); \
         a user name or password must write / ? # @ [ ] % as %2F %3F %23 %40 %5B %5D %25"
    )
}

/// What to say about `url` when reading it failed with `reason`, without
/// ever showing its password. A password (or lone user info) holding a
/// character that breaks URL structure (`/ ? # @ [ ] %`) makes parsers
/// quote pieces of it, so their reason is dropped for a hint about
/// %-escaping; otherwise `reason` is kept with the secret, as written and
/// decoded, replaced by `***`.
pub fn unreadable_reason(url: &str, reason: &str) -> String {
    let Some((scheme, info, _)) = user_info(url) else {
        return reason.to_owned();
    };
    if cuts_the_secret(info) {
        return unreadable_hint(scheme.unwrap_or("store"));
    }
    let secret = info.split_once(':').map_or(info, |(_, password)| password);
    let mut out = reason.to_owned();
    let decoded = percent_decode(secret);
    for s in [Some(secret.to_owned()), decoded].into_iter().flatten() {
        if !s.is_empty() {
            out = out.replace(&s, "***");
        }
    }
    out
}

/// A store URL taken apart at its query, for a backend that reads some
/// parameters itself and passes the others on to its client: the part
/// before `?`, the `key=value` pairs as written (not decoded), and a
/// `#fragment`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query<'a> {
    /// Everything before `?` (or before `#` when there is no query).
    pub base: &'a str,
    /// The query's pairs in order; a pair without `=` has an empty value.
    pub pairs: Vec<(&'a str, &'a str)>,
    /// What follows `#`, if anything.
    pub fragment: Option<&'a str>,
}

impl<'a> Query<'a> {
    /// Splits `url`.
    pub fn split(url: &'a str) -> Self {
        let (rest, fragment) = match url.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (url, None),
        };
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let pairs = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")))
            .collect();
        Self {
            base,
            pairs,
            fragment,
        }
    }

    /// The URL again with only the `kept` pairs (and the fragment).
    pub fn rebuild(&self, kept: &[(&str, &str)]) -> String {
        let mut url = self.base.to_owned();
        for (i, (key, value)) in kept.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(key);
            url.push('=');
            url.push_str(value);
        }
        if let Some(fragment) = self.fragment {
            url.push('#');
            url.push_str(fragment);
        }
        url
    }
}

/// The host, port and path of a URL's base (the part before `?`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authority<'a> {
    /// The host as written; a bracketed IPv6 address keeps its brackets.
    /// Empty when the URL names none.
    pub host: &'a str,
    /// The port, if the URL has one.
    pub port: Option<u16>,
    /// The path, from its `/` on (empty when there is none).
    pub path: &'a str,
}

impl<'a> Authority<'a> {
    /// Reads `scheme://[userinfo@]host[:port][/path]`. The user info (up
    /// to the last `@` before the path) is skipped and never appears in an
    /// error.
    ///
    /// # Errors
    ///
    /// What is wrong, in words: no `scheme://`, an unclosed IPv6 address,
    /// a port that is not a number from 0 to 65535, a host with `?`, `#`
    /// or a space.
    pub fn of(base: &'a str) -> Result<Self, String> {
        let rest = base
            .split_once("://")
            .map(|(_, rest)| rest)
            .ok_or("it must start with scheme://")?;
        let end = rest.find('/').unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
            let (_, after) = v6
                .split_once(']')
                .ok_or("an IPv6 address is missing its closing ']'")?;
            let host = &host_port[..host_port.len() - after.len()];
            match after {
                "" => (host, None),
                _ => (
                    host,
                    Some(
                        after
                            .strip_prefix(':')
                            .ok_or("junk after the IPv6 address")?,
                    ),
                ),
            }
        } else {
            match host_port.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (host_port, None),
            }
        };
        let port = match port {
            None | Some("") => None,
            Some(port) => Some(
                port.parse::<u16>()
                    .map_err(|_| format!("the port {port:?} is not a number from 0 to 65535"))?,
            ),
        };
        if host.contains(['?', '#', ' ']) {
            return Err(format!("the host {host:?} is not a host name"));
        }
        Ok(Self { host, port, path })
    }
}

/// A whole number of milliseconds, for query parameter `key`.
///
/// # Errors
///
/// A message naming `key` and the value when it is not a whole number.
pub fn millis(key: &str, value: &str) -> Result<std::time::Duration, String> {
    value
        .parse::<u64>()
        .map(std::time::Duration::from_millis)
        .map_err(|_| format!("{key} must be a whole number of milliseconds, not {value:?}"))
}

/// A duration longer than zero, in milliseconds, for query parameter `key`.
///
/// # Errors
///
/// As [`millis`], and a message when it is zero.
pub fn positive_millis(key: &str, value: &str) -> Result<std::time::Duration, String> {
    let d = millis(key, value)?;
    if d.is_zero() {
        return Err(format!("{key} must be longer than zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_the_user_info_up_to_the_last_at() {
        assert_eq!(
            redact("postgres://app:pa/ss@db:5432/cron?table=x"),
            "postgres://app:***@db:5432/cron?table=x"
        );
        assert_eq!(redact("redis://p?a#s@h:6379"), "redis://***@h:6379");
        assert_eq!(
            redact("nats://n@h:4222?token=abc&prefix=p"),
            "nats://***@h:4222?token=***&prefix=p"
        );
        assert_eq!(redact("sqlite://cron.db"), "sqlite://cron.db");
    }

    #[test]
    fn every_store_scheme_is_redacted() {
        for (url, want) in [
            (
                "postgres://app:s3cret@db:5432/cron",
                "postgres://app:***@db:5432/cron",
            ),
            ("redis://:pw@h:6379", "redis://:***@h:6379"),
            ("redis://pw@h:6379", "redis://***@h:6379"),
            ("nats://tok3n@h:4222", "nats://***@h:4222"),
            ("nats-kv://tok3n@h:4222", "nats-kv://***@h:4222"),
            ("tls://tok3n@h:4222", "tls://***@h:4222"),
            ("nats-kv+tls://tok3n@h:4222", "nats-kv+tls://***@h:4222"),
            ("amqp://guest@h/%2f?x=1", "amqp://guest@h/%2f?x=1"),
            (
                "postgres://h/db?user=u&password=hunter2&sslmode=require",
                "postgres://h/db?user=u&password=***&sslmode=require",
            ),
            (
                "rediss://u:pw@h:6380/0?strategy=lease#insecure",
                "rediss://u:***@h:6380/0?strategy=lease#insecure",
            ),
            ("sqlite://anarchon.db", "sqlite://anarchon.db"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn a_broken_password_drops_the_parsers_reason() {
        let url = "postgres://app:pa/ss@db:5432/cron";
        let said = unreadable_reason(url, "the port \"pa\" is not a number");
        assert!(!said.contains("pa\""), "{said}");
        assert!(said.contains("%2F"), "{said}");
        let url = "postgres://app:hunter2@db:5432/cron?x=1";
        assert_eq!(
            unreadable_reason(url, "unknown parameter x (hunter2)"),
            "unknown parameter x (***)"
        );
    }

    #[test]
    fn escapes_are_decoded_and_broken_ones_refused() {
        assert_eq!(percent_decode("a%20b%2Fc+d"), Some("a b/c+d".to_owned()));
        assert_eq!(percent_decode("a%2"), None);
        assert_eq!(percent_decode("a%+1"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }

    #[test]
    fn queries_split_and_rebuild() {
        let q = Query::split("redis://u:p@h:6379/2?strategy=lease&protocol=resp3&x#insecure");
        assert_eq!(q.base, "redis://u:p@h:6379/2");
        assert_eq!(
            q.pairs,
            [("strategy", "lease"), ("protocol", "resp3"), ("x", "")]
        );
        assert_eq!(q.fragment, Some("insecure"));
        assert_eq!(
            q.rebuild(&[("protocol", "resp3")]),
            "redis://u:p@h:6379/2?protocol=resp3#insecure"
        );
        assert_eq!(Query::split("sqlite://a.db").rebuild(&[]), "sqlite://a.db");
    }

    #[test]
    fn authorities_are_read_without_the_user_info() {
        let a = Authority::of("postgres://app:s3cret@db.internal:6543/cron").unwrap();
        assert_eq!(
            (a.host, a.port, a.path),
            ("db.internal", Some(6543), "/cron")
        );
        let a = Authority::of("redis://[::1]:7000").unwrap();
        assert_eq!((a.host, a.port, a.path), ("[::1]", Some(7000), ""));
        let a = Authority::of("postgres://app@/cron").unwrap();
        assert_eq!((a.host, a.port), ("", None));
        for (bad, says) in [
            ("db:5432", "scheme://"),
            ("redis://[::1", "closing"),
            ("redis://[::1]x", "junk"),
            ("redis://u:s3cret@h:port", "the port \"port\""),
            ("redis://h:70000", "65535"),
        ] {
            let err = Authority::of(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
        assert!(
            millis("timeout_ms", "x")
                .unwrap_err()
                .contains("timeout_ms")
        );
        assert!(
            positive_millis("timeout_ms", "0")
                .unwrap_err()
                .contains("longer than zero")
        );
    }
}
