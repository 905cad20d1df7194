//! The Guitar reviewer of the classic controller tutorial (`guitars.kool.karmalabs.local`):
//! a Guitar without `spec.review: true` gets reviewed — `spec.review: true` and a
//! `spec.comment` by its brand — and a reviewed Guitar is never touched again, so the
//! controller cannot loop on its own writes, and editing the brand later does not re-review.

use kubewasm_guest_sdk::{Cluster, Error, Request, Response, object};
use serde_json::{Value, json};

/// Brands the reviewer likes.
pub const GOOD_BRANDS: [&str; 8] = [
    "coleclark",
    "fender",
    "gibson",
    "ibanez",
    "martin",
    "seagull",
    "squier",
    "washburn",
];

/// Brands the reviewer does not.
pub const DISLIKED_BRANDS: [&str; 9] = [
    "epiphone",
    "guild",
    "gretsch",
    "jackson",
    "ovation",
    "prs",
    "rickenbauer",
    "taylor",
    "yamaha",
];

/// Longest brand quoted back in a comment (the rest of a longer one is left out).
const MAX_BRAND_CHARS: usize = 64;

/// What the reviewer says of a brand (compared case-insensitively, spaces ignored).
pub fn comment(brand: &str) -> String {
    let key: String = brand
        .chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect();
    let shown: String = brand.trim().chars().take(MAX_BRAND_CHARS).collect();
    if GOOD_BRANDS.contains(&key.as_str()) {
        format!("{shown} makes great guitars: a fine choice")
    } else if DISLIKED_BRANDS.contains(&key.as_str()) {
        format!("{shown} is not a brand this reviewer would pick: worth a second look")
    } else if shown.is_empty() {
        "no brand given, so no opinion: set spec.brand for a review".to_owned()
    } else {
        format!("{shown} is an unknown brand to this reviewer: no opinion, sorry")
    }
}

/// Reviews the Guitar unless it is reviewed already.
pub fn reconcile(req: &Request, _cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(guitar) = &req.parent else {
        return Ok(Response::new());
    };
    if object::spec(guitar).and_then(|s| s.get("review")) == Some(&Value::Bool(true)) {
        return Ok(Response::new());
    }
    let brand = object::spec_str(guitar, "brand").unwrap_or_default();
    let review = object::object(
        &req.target.api_version,
        &req.target.kind,
        req.target.namespace.as_deref(),
        &req.target.name,
    )
    .spec(json!({ "review": true, "comment": comment(brand) }));
    Ok(Response::new().apply(review))
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
