//! The object set of a run: listed with ListObjectsV2 or named `PREFIX{i:06}`.
//!
//! Listings are parsed by `granary_proto::xml`, the S3 XML of the whole workspace.

use crate::size::SizeRange;

/// One object to read or write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub key: String,
    /// Size in bytes; 0 when not known (a plain GET of a named key).
    pub size: u64,
}

/// The objects `P000000`, `P000001`, …, each of a size drawn uniformly from
/// `sizes` (seeded, so a PUT run and a later GET run agree on them).
pub fn generated(prefix: &str, count: usize, sizes: SizeRange, seed: u64) -> Vec<Object> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x0B1E_C751_2E5D);
    (0..count)
        .map(|i| Object {
            key: format!("{prefix}{i:06}"),
            size: if sizes.min == sizes.max {
                sizes.min
            } else {
                rng.gen_range(sizes.min..=sizes.max)
            },
        })
        .collect()
}

/// One page of a ListObjectsV2 answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub objects: Vec<Object>,
    /// The token for the next page when the listing is truncated.
    pub next_token: Option<String>,
}

/// Parses one ListObjectsV2 page (with `granary_proto::xml`); an error document, or a
/// truncated page without a token, is an error.
pub fn parse_list_page(xml: &str) -> anyhow::Result<ListPage> {
    let page = granary_proto::xml::ListPage::parse(xml.as_bytes())
        .map_err(|e| anyhow::anyhow!("listing: {e}"))?;
    if page.is_truncated && page.next_token.is_none() {
        anyhow::bail!("listing is truncated but has no NextContinuationToken");
    }
    Ok(ListPage {
        objects: page
            .objects
            .into_iter()
            .map(|o| Object {
                key: o.key,
                size: o.size,
            })
            .collect(),
        next_token: page.next_token.filter(|_| page.is_truncated),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE1: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsTruncated>true</IsTruncated>
<Contents><Key>d/a&amp;b.tar</Key><Size>1048576</Size></Contents>
<Contents><Key>d/caf&#233; &lt;1&gt;</Key><Size>7</Size></Contents>
<NextContinuationToken>tok+/=1</NextContinuationToken></ListBucketResult>"#;

    #[test]
    fn parses_keys_sizes_and_token() {
        let p = parse_list_page(PAGE1).unwrap();
        assert_eq!(p.objects.len(), 2);
        assert_eq!(p.objects[0].key, "d/a&b.tar");
        assert_eq!(p.objects[0].size, 1_048_576);
        assert_eq!(p.objects[1].key, "d/café <1>");
        assert_eq!(p.objects[1].size, 7);
        assert_eq!(p.next_token.as_deref(), Some("tok+/=1"));
    }

    #[test]
    fn last_page_and_empty() {
        let last = "<ListBucketResult><IsTruncated>false</IsTruncated>\
                    <Contents><Key>x</Key><Size>3</Size></Contents></ListBucketResult>";
        let p = parse_list_page(last).unwrap();
        assert_eq!(
            p.objects,
            vec![Object {
                key: "x".into(),
                size: 3
            }]
        );
        assert_eq!(p.next_token, None);
        let empty = "<ListBucketResult><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>";
        assert_eq!(parse_list_page(empty).unwrap().objects.len(), 0);
    }

    #[test]
    fn errors_are_reported() {
        let err = "<Error><Code>NoSuchBucket</Code><Message>no such bucket</Message></Error>";
        let e = parse_list_page(err).unwrap_err().to_string();
        assert!(e.contains("NoSuchBucket"), "{e}");
        assert!(parse_list_page("<IsTruncated>true</IsTruncated>").is_err());
        assert!(parse_list_page("<Contents><Size>1</Size></Contents>").is_err());
    }

    #[test]
    fn generated_names() {
        let fixed = SizeRange { min: 10, max: 10 };
        let g = generated("p/", 3, fixed, 1);
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].key, "p/000000");
        assert_eq!(g[2].key, "p/000002");
        assert!(g.iter().all(|o| o.size == 10));
        let range = SizeRange { min: 100, max: 200 };
        let a = generated("p/", 50, range, 7);
        assert!(a.iter().all(|o| (100..=200).contains(&o.size)));
        assert!(a.iter().any(|o| o.size != a[0].size), "sizes vary");
        assert_eq!(a, generated("p/", 50, range, 7), "same seed, same sizes");
    }
}
