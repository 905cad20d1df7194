//! What a module must be before it is compiled, beyond being a component of the world.

use super::error::LoadError;

/// Refuses a component (or any component nested in it) with a canonical option other than
/// UTF-8 strings: for UTF-16 and Latin-1, wasmtime transcodes each string the guest hands the
/// host into host memory before the host sees its length, so no bound of the host could hold.
/// A component that does not parse is left to the compiler, which says why.
pub(crate) fn utf8_strings_only(bytes: &[u8]) -> Result<(), LoadError> {
    use wasmparser::{CanonicalFunction as F, CanonicalOption, Parser, Payload};
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(Payload::ComponentCanonicalSection(section)) = payload else {
            continue;
        };
        for function in section.into_iter().flatten() {
            let options: &[CanonicalOption] = match &function {
                F::Lift { options, .. }
                | F::Lower { options, .. }
                | F::TaskReturn { options, .. }
                | F::StreamRead { options, .. }
                | F::StreamWrite { options, .. }
                | F::FutureRead { options, .. }
                | F::FutureWrite { options, .. }
                | F::ErrorContextNew { options }
                | F::ErrorContextDebugMessage { options } => options,
                _ => &[],
            };
            for option in options {
                let encoding = match option {
                    CanonicalOption::UTF16 => "UTF-16",
                    CanonicalOption::CompactUTF16 => "Latin-1+UTF-16",
                    _ => continue,
                };
                return Err(LoadError::StringEncoding { encoding });
            }
        }
    }
    Ok(())
}
