//! What the runtime must know of a source beside its module's bytes, asked without naming its
//! kind: each method matches every kind of [`Source`] (no `_` arm), so a new kind is a compile
//! error here until it says what it watches, pulls, shares and shows.

use kubewasm_api::Source;

use crate::Version;

/// See the module doc.
pub trait Sourced {
    /// The ConfigMap (`namespace`, `name`) whose changes load the module again: a ConfigMap is
    /// watched by the runtime's metadata watch rather than read every poll.
    fn watched_config_map(&self) -> Option<(&str, &str)>;

    /// Whether the module is fetched by a pull beside the manager loop ([`crate::Pulls`],
    /// keyed by its controller): the loop is woken when it ends, and forgets the pulls of
    /// controllers whose source is no longer pulled.
    fn pulled(&self) -> bool;

    /// The Secret fetching reads as the controller's ServiceAccount (a registry's pull
    /// secret), if any: the runtime must be able to act as that account first.
    fn credentials(&self) -> Option<&str>;

    /// Whether the module may be shared by every controller naming the same source, and by
    /// what: an image pinned by digest and pulled anonymously (anyone may pull those bytes,
    /// and the reference names them). Its reference (`registry/repository@sha256:…`, without
    /// the tag) and the manifest digest.
    fn shareable(&self) -> Option<(String, String)>;

    /// What a capsule and the log lines name as the module's origin at `version`: the image
    /// manifest it was pulled as (`registry/repository@sha256:…`), for sources that have one.
    fn image_at(&self, version: &Version) -> Option<String>;
}

impl Sourced for Source {
    fn watched_config_map(&self) -> Option<(&str, &str)> {
        match self {
            Source::ConfigMap {
                namespace, name, ..
            } => Some((namespace, name)),
            Source::File { .. } | Source::Oci { .. } => None,
        }
    }

    fn pulled(&self) -> bool {
        match self {
            Source::Oci { .. } => true,
            Source::ConfigMap { .. } | Source::File { .. } => false,
        }
    }

    fn credentials(&self) -> Option<&str> {
        match self {
            Source::Oci { pull_secret, .. } => pull_secret.as_deref(),
            Source::ConfigMap { .. } | Source::File { .. } => None,
        }
    }

    fn shareable(&self) -> Option<(String, String)> {
        match self {
            Source::Oci {
                image,
                pull_secret: None,
            } => {
                let digest = image.digest()?;
                Some((image.at(digest), digest.to_owned()))
            }
            Source::Oci { .. } | Source::ConfigMap { .. } | Source::File { .. } => None,
        }
    }

    fn image_at(&self, version: &Version) -> Option<String> {
        match (self, version) {
            (Source::Oci { image, .. }, Version::Image(digest)) => Some(image.at(digest)),
            (Source::Oci { .. } | Source::ConfigMap { .. } | Source::File { .. }, _) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use kubewasm_api::ImageRef;

    use super::*;

    fn oci(reference: &str, pull_secret: Option<&str>) -> Source {
        Source::Oci {
            image: ImageRef::parse(reference).unwrap(),
            pull_secret: pull_secret.map(str::to_owned),
        }
    }

    #[test]
    fn only_anonymous_digest_pinned_images_are_shared() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let pinned = format!("registry.example/team/hello:v1@{digest}");
        assert_eq!(
            oci(&pinned, None).shareable(),
            Some((
                format!("registry.example/team/hello@{digest}"),
                digest.clone()
            )),
            "the tag is not part of the reference"
        );
        assert_eq!(
            oci(&pinned, Some("regcred")).shareable(),
            None,
            "a pull secret's reads are its tenant's"
        );
        assert_eq!(
            oci("registry.example/team/hello:v1", None).shareable(),
            None,
            "a tag may move"
        );
        let config_map = Source::ConfigMap {
            namespace: "team".into(),
            name: "m".into(),
            key: "m.wasm".into(),
        };
        assert_eq!(config_map.shareable(), None);
    }

    #[test]
    fn each_kind_says_what_it_watches_pulls_and_shows() {
        let digest = format!("sha256:{}", "b".repeat(64));
        let tag = oci("registry.example/team/hello:v1", Some("regcred"));
        assert!(tag.pulled());
        assert_eq!(tag.credentials(), Some("regcred"));
        assert_eq!(tag.watched_config_map(), None);
        assert_eq!(
            tag.image_at(&Version::Image(digest.clone())),
            Some(format!("registry.example/team/hello@{digest}")),
            "the manifest pulled, not the tag"
        );
        assert_eq!(
            tag.image_at(&Version::Digest(kubewasm_sandbox::Digest::of(b"m"))),
            None
        );
        let config_map = Source::ConfigMap {
            namespace: "team".into(),
            name: "m".into(),
            key: "m.wasm".into(),
        };
        assert_eq!(config_map.watched_config_map(), Some(("team", "m")));
        assert!(!config_map.pulled());
        assert_eq!(config_map.credentials(), None);
        let file = Source::File {
            path: "/modules/m.wasm".into(),
        };
        assert_eq!(
            (file.watched_config_map(), file.pulled(), file.credentials()),
            (None, false, None)
        );
    }
}
