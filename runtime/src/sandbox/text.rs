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
    fn a_bound_too_small_for_the_marker_keeps_a_bare_prefix() {
        assert_eq!(bounded("abcdefghij", 4), "abcd");
        assert_eq!(bounded("é€🦀", 4), "é");
    }
}
