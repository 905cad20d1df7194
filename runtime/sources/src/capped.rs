//! The one capped reader every body a registry sends goes through: a response (refused at
//! once when its length says more than the cap), or a stream of chunks, read to at most a
//! cap, or to exactly a declared size. Nothing past the cap is ever held.

use futures::StreamExt;

use super::oci::PullError;

/// A response's body, at most `max` bytes: refused at once when its length says more.
pub async fn read_body(
    response: reqwest::Response,
    max: u64,
    what: &'static str,
) -> Result<Vec<u8>, PullError> {
    if response.content_length().is_some_and(|length| length > max) {
        return Err(PullError::TooBig { what, max });
    }
    let stream = response
        .bytes_stream()
        .map(|chunk| chunk.map_err(std::io::Error::other));
    read_at_most(stream, max, what).await
}

/// Reads `stream` to its end, refusing it the moment it passes `declared` bytes or ends short.
pub async fn read_capped(
    mut stream: impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin,
    declared: u64,
    what: &'static str,
) -> Result<Vec<u8>, PullError> {
    let corrupt = |why: String| PullError::Corrupt { what, why };
    let mut bytes = Vec::with_capacity(usize::try_from(declared.min(1 << 20)).unwrap_or(0));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| corrupt(e.to_string()))?;
        if bytes.len() as u64 + chunk.len() as u64 > declared {
            return Err(corrupt(format!(
                "it goes on past the {declared} bytes its descriptor says (the rest was not read)"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    if bytes.len() as u64 != declared {
        return Err(corrupt(format!(
            "it ended after {} of the {declared} bytes its descriptor says",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Reads `stream` to its end, refusing it the moment it passes `max` bytes.
pub async fn read_at_most(
    mut stream: impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin,
    max: u64,
    what: &'static str,
) -> Result<Vec<u8>, PullError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| PullError::Corrupt {
            what,
            why: e.to_string(),
        })?;
        if bytes.len() as u64 + chunk.len() as u64 > max {
            return Err(PullError::TooBig { what, max });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}
