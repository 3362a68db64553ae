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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_decoded_and_broken_ones_refused() {
        assert_eq!(percent_decode("a%20b%2Fc+d"), Some("a b/c+d".to_owned()));
        assert_eq!(percent_decode("a%2"), None);
        assert_eq!(percent_decode("a%+1"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }
}
