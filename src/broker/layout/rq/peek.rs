//! `jobrelay peek` in the rq layout: a queue's list `<ns>rq:queue:<queue>` (RQ's worker pops
//! from the left) and scheduled registry `<ns>rq:scheduled:<queue>` hold job ids; each job is
//! the hash `<ns>rq:job:<id>` (docs/layouts/rq.md#keys-of-the-rq-layout).

use super::super::peek::{hash_fields, json_or_text, Decoded, End, NoShelf, Peek, Shelf, Stored};
use super::{Rq, QUEUE_INFIX};

/// The job hash's key before the id.
const JOB_INFIX: &str = "rq:job:";

/// The most bytes a job's `data` is inflated to for display.
const MAX_DATA: usize = 64 << 20;

impl Peek for Rq {
    fn queue_shelf(&self, namespace: &str, queue: &str) -> Shelf {
        Shelf::list(format!("{namespace}{QUEUE_INFIX}{queue}"), End::Left)
            .of_hashes(format!("{namespace}{JOB_INFIX}"))
    }

    fn scheduled_shelf(&self, namespace: &str, queue: Option<&str>) -> Result<Shelf, NoShelf> {
        let queue = queue.ok_or_else(|| {
            NoShelf(
                "--scheduled needs --queue in the rq layout: each queue has its own scheduled \
                 registry"
                    .to_owned(),
            )
        })?;
        Ok(
            Shelf::scheduled(format!("{namespace}rq:scheduled:{queue}"), None)
                .of_hashes(format!("{namespace}{JOB_INFIX}")),
        )
    }

    /// The job hash's fields as `HGETALL` gives them; `data` inflated (zlib) and parsed as the
    /// JSON serializer's `[func_name, instance, args, kwargs]`, `meta` parsed as JSON.
    fn decode(&self, stored: Stored<'_>) -> Decoded {
        let (mut d, fields) = match Decoded::of_job_hash(stored, "an RQ") {
            Ok(found) => found,
            Err(undecodable) => return undecodable,
        };
        hash_fields(&mut d, fields, |d, name, value| match name {
            "data" => {
                match miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(value, MAX_DATA) {
                    Ok(data) => match std::str::from_utf8(&data) {
                        Ok(text) => d.field("data", json_or_text(text)),
                        Err(_) => d.bytes("data", &data),
                    },
                    Err(e) => d
                        .field("data_inflate_error", format!("{e:?}"))
                        .bytes("data", value),
                };
                true
            }
            "meta" => match std::str::from_utf8(value) {
                Ok(text) => {
                    d.field("meta", json_or_text(text));
                    true
                }
                Err(_) => false,
            },
            "origin" => {
                d.queue = Some(String::from_utf8_lossy(value).into_owned());
                false
            }
            _ => false,
        });
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_inflated_whether_stored_or_compressed() {
        let json = br#"["app.tasks.send", null, [42], {"lang": "de"}]"#;
        let mut stored = Vec::new();
        super::super::zlib_stored(json, &mut stored);
        // Python's zlib.compress(b'["app.tasks.send", null, [42], {"lang": "de"}]').
        let compressed: &[u8] = &[
            0x78, 0x9c, 0x8b, 0x56, 0x4a, 0x2c, 0x28, 0xd0, 0x2b, 0x49, 0x2c, 0xce, 0x2e, 0xd6,
            0x2b, 0x4e, 0xcd, 0x4b, 0x51, 0xd2, 0x51, 0xc8, 0x2b, 0xcd, 0xc9, 0xd1, 0x51, 0x88,
            0x36, 0x31, 0x8a, 0xd5, 0x51, 0xa8, 0x56, 0xca, 0x49, 0xcc, 0x4b, 0x57, 0xb2, 0x52,
            0x50, 0x4a, 0x49, 0x55, 0xaa, 0x8d, 0x05, 0x00, 0x61, 0xab, 0x0e, 0x6c,
        ];
        for data in [stored, compressed.to_vec()] {
            let fields = vec![
                (b"data".to_vec(), data),
                (b"origin".to_vec(), b"emails".to_vec()),
                (b"meta".to_vec(), br#"{"traceparent": "00-x"}"#.to_vec()),
            ];
            let d = Rq.decode(Stored::Hash {
                id: "6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7",
                fields: &fields,
            });
            assert_eq!(
                d.get("data"),
                Some(&serde_json::json!(["app.tasks.send", null, [42], {"lang": "de"}])),
                "{d:?}"
            );
            assert_eq!(d.queue.as_deref(), Some("emails"));
            assert_eq!(d.get("meta").unwrap()["traceparent"], "00-x");
        }
        let missing = Rq.decode(Stored::Hash {
            id: "x",
            fields: &[],
        });
        assert!(missing.get("undecodable").is_some());
    }
}
