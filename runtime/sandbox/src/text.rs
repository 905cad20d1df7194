//! Bounds on the text a guest hands the host, applied where the text enters.
//!
//! A tenant's guest can make any string as long as its memory allows; whatever the host keeps
//! (typed errors, status, Events) or writes to its own log is cut to one of these bounds first,
//! so one guest cannot blow up the runtime's memory, its log volume or an API object.

use std::borrow::Cow;

/// Most bytes kept of a guest's own error message, of a panic message with its location and
/// of an Event's message. Matches the API server's limit on an Event's note (1 KiB).
pub const MAX_GUEST_MESSAGE_BYTES: usize = 1024;

/// Most bytes kept of an Event's reason: the API server refuses longer ones
/// (`events.k8s.io/v1` validation).
pub const MAX_EVENT_REASON_BYTES: usize = 128;

/// Most bytes of one line a guest logs (each host `log` call, each line of captured
/// stdout/stderr). The per-call total is [`Limits::log_bytes`](super::Limits::log_bytes).
pub const MAX_GUEST_LOG_LINE_BYTES: usize = 4096;

/// `text` if it is at most `max` bytes; otherwise its longest prefix that, ending on a char
/// boundary and followed by a marker `… (N more bytes)`, fits in `max` bytes. The result is
/// never longer than `max` (when `max` is too small for the marker, the prefix goes without it).
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    truncated(text, max).0
}

/// [`bounded`], plus how many bytes of `text` were cut off.
pub(crate) fn truncated(text: &str, max: usize) -> (Cow<'_, str>, usize) {
    if text.len() <= max {
        return (Cow::Borrowed(text), 0);
    }
    // The marker's length with the largest count it could show; the real one is no longer.
    let marker_room = marker(text.len()).len();
    let Some(room) = max.checked_sub(marker_room) else {
        let kept = prefix(text, max);
        return (Cow::Borrowed(kept), text.len() - kept.len());
    };
    let kept = prefix(text, room);
    let cut = text.len() - kept.len();
    (Cow::Owned(format!("{kept}{}", marker(cut))), cut)
}

/// Guest text made safe to log or to show in a status: every character that could end a log
/// line or change how a terminal shows it (control characters, Unicode line separators and
/// bidirectional overrides) escaped as Rust does (`\n`, `\u{1b}`), then cut to `max` bytes
/// as [`bounded`] does. Only what fits is escaped, so a huge text costs no huge copy.
pub fn guest_text(text: &str, max: usize) -> Cow<'_, str> {
    escaped(text, max).0
}

/// [`guest_text`], plus how many bytes of `text` were cut off.
pub(crate) fn escaped(text: &str, max: usize) -> (Cow<'_, str>, usize) {
    if !prefix(text, max).chars().any(must_escape) {
        // What is kept is a prefix of at most `max` bytes: nothing in it to escape.
        return truncated(text, max);
    }
    let (all, used) = escape_within(text, max);
    if used == text.len() {
        return (Cow::Owned(all), 0);
    }
    let Some(room) = max.checked_sub(marker(text.len()).len()) else {
        return (Cow::Owned(all), text.len() - used);
    };
    let (kept, used) = escape_within(text, room);
    let cut = text.len() - used;
    (Cow::Owned(format!("{kept}{}", marker(cut))), cut)
}

/// Characters a guest may not put into a log line or a status as they are.
fn must_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The escaped form of the longest prefix of `text` whose escaped form fits in `max` bytes,
/// and how many bytes of `text` that prefix is.
fn escape_within(text: &str, max: usize) -> (String, usize) {
    let mut out = String::with_capacity(max.min(text.len()));
    let mut used = 0;
    for c in text.chars() {
        let before = out.len();
        if must_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > max {
            out.truncate(before);
            break;
        }
        used += c.len_utf8();
    }
    (out, used)
}

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary.
pub(crate) fn prefix(text: &str, max: usize) -> &str {
    &text[..text.floor_char_boundary(max)]
}

fn marker(cut: usize) -> String {
    format!("… ({cut} more bytes)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_as_is() {
        assert!(matches!(bounded("hello", 5), Cow::Borrowed("hello")));
        assert_eq!(bounded("", 0), "");
    }

    #[test]
    fn long_text_is_cut_with_a_marker_within_the_bound() {
        let text = "x".repeat(100);
        let got = bounded(&text, 40);
        // Room is kept for a 3-digit count, so this one, with 2 digits, ends a byte short.
        assert_eq!(got, format!("{}… (80 more bytes)", "x".repeat(20)));
        assert_eq!(got.len(), 39);
        let (_, cut) = truncated(&text, 40);
        assert_eq!(cut, 80);
    }

    #[test]
    fn cuts_only_on_char_boundaries() {
        // "é" is 2 bytes, "€" 3, "🦀" 4: every cut point lands inside some of them.
        let text = "é€🦀".repeat(50);
        for max in 0..text.len() + 2 {
            let got = bounded(&text, max);
            assert!(got.len() <= max, "{max}: {} bytes", got.len());
            let kept = got.split('…').next().unwrap();
            assert!(text.starts_with(kept), "{max}: {kept:?}");
            if max >= text.len() {
                assert_eq!(got, text);
            } else if max >= 20 {
                let cut = text.len() - kept.len();
                assert!(got.ends_with(&format!("… ({cut} more bytes)")), "{got}");
            }
        }
        assert_eq!(prefix("🦀", 3), "");
        assert_eq!(prefix("a🦀", 4), "a");
    }

    #[test]
    fn guest_text_cannot_forge_a_log_line_or_a_terminal_sequence() {
        let forged =
            "ok\n2026-11-25T00:00:00Z  INFO kubewasm: leader lost\r\u{1b}[2J\u{2028}\u{202e}";
        let got = guest_text(forged, 4096);
        assert_eq!(
            got,
            "ok\\n2026-11-25T00:00:00Z  INFO kubewasm: leader lost\\r\\u{1b}[2J\\u{2028}\\u{202e}"
        );
        assert!(!got.chars().any(must_escape), "{got}");
        // Plain text is borrowed, as `bounded` does.
        assert!(matches!(
            guest_text("plain é", 64),
            Cow::Borrowed("plain é")
        ));
        // Cut within the bound, never in the middle of an escape, counting the raw bytes cut.
        let long = "\n".repeat(1000);
        for max in [0, 1, 2, 5, 30, 31, 100, 2000, 2001] {
            let (got, cut) = escaped(&long, max);
            assert!(got.len() <= max, "{max}: {}", got.len());
            assert!(!got.contains('\n'), "{max}: {got}");
            let kept = got.split('…').next().unwrap();
            assert_eq!(kept.len() % 2, 0, "{max}: {kept}");
            assert_eq!(cut, 1000 - kept.len() / 2, "{max}: {got}");
        }
        assert_eq!(escaped(&long, 2000), (Cow::Owned("\\n".repeat(1000)), 0));
    }

    #[test]
    fn a_bound_too_small_for_the_marker_keeps_a_bare_prefix() {
        assert_eq!(bounded("abcdefghij", 4), "abcd");
        assert_eq!(bounded("é€🦀", 4), "é");
    }
}
