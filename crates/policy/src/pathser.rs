//! Lossless JSON for paths: a path that is valid UTF-8 is a JSON string, as
//! always; any other (Linux paths are bytes) is `{"bytes_hex": "2f746d70…"}`,
//! its raw bytes in lowercase hex. Strings and objects cannot be confused,
//! so two different paths never share a canonical form (serde's own
//! `PathBuf` encoding fails on non-UTF-8, which made the whole canonical
//! policy `null`).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serializer};

const BYTES_KEY: &str = "bytes_hex";

/// Serializes one path losslessly.
pub fn serialize<S: Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    match path.to_str() {
        Some(text) => s.serialize_str(text),
        None => {
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry(BYTES_KEY, &hex(path.as_os_str().as_bytes()))?;
            map.end()
        }
    }
}

/// Reads what [`serialize`] wrote.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Text(String),
        Bytes { bytes_hex: String },
    }
    match Repr::deserialize(d)? {
        Repr::Text(t) => Ok(PathBuf::from(t)),
        Repr::Bytes { bytes_hex } => unhex(&bytes_hex)
            .map(|b| PathBuf::from(OsString::from_vec(b)))
            .ok_or_else(|| D::Error::custom("bytes_hex is not lowercase hex of even length")),
    }
}

/// The same for a list of paths.
pub mod vec {
    use super::*;
    use serde::ser::SerializeSeq;

    struct One<'a>(&'a Path);
    impl serde::Serialize for One<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            super::serialize(self.0, s)
        }
    }

    pub fn serialize<S: Serializer>(paths: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(paths.len()))?;
        for p in paths {
            seq.serialize_element(&One(p))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super")] PathBuf);
        Ok(Vec::<Wrapped>::deserialize(d)?
            .into_iter()
            .map(|w| w.0)
            .collect())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Holder {
        #[serde(with = "super")]
        one: PathBuf,
        #[serde(with = "super::vec")]
        many: Vec<PathBuf>,
    }

    #[test]
    fn round_trips_utf8_and_raw_bytes() {
        let raw = PathBuf::from(OsString::from_vec(b"/tmp/a\xffb".to_vec()));
        let h = Holder {
            one: raw.clone(),
            many: vec![PathBuf::from("/ok"), raw],
        };
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(
            json,
            r#"{"one":{"bytes_hex":"2f746d702f61ff62"},"many":["/ok",{"bytes_hex":"2f746d702f61ff62"}]}"#
        );
        assert_eq!(serde_json::from_str::<Holder>(&json).unwrap(), h);
        assert!(serde_json::from_str::<Holder>(r#"{"one":{"bytes_hex":"FF"},"many":[]}"#).is_err());
    }
}
