//! Opens whole batches of sealed reports in one call, with the GIL released.
//!
//! A sealed record (`ldp_core/wire/sealing.py`, docs/SEALED.md) is `key id (4) || enc (32) || ct || tag (16)`:
//! a single-shot HPKE base-mode message (RFC 9180: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM)
//! with an empty aad and an `info` the Python side builds (`sealed_info`) for each key of the ring.
//! Every primitive is aws-lc-rs's: X25519 (which refuses the all-zero shared secret of a low-order point,
//! RFC 9180 §7.1.4), HKDF-SHA256 and AES-128-GCM; this file only lays out RFC 9180's labels (§4, §5.1) and
//! walks the records. Each record gets one status byte, the same categories as the Python opener's.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
use aws_lc_rs::agreement::{agree, PrivateKey, UnparsedPublicKey, X25519};
use aws_lc_rs::hkdf::{KeyType, Prk, Salt, HKDF_SHA256};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

const KEY_ID: usize = 4;
const NENC: usize = 32;
const NT: usize = 16;
const NK: usize = 16; // AES-128-GCM key
const NN: usize = 12;
const NH: usize = 32;
const V1: &[u8] = b"HPKE-v1";
const KEM_SUITE: &[u8] = b"KEM\x00\x20"; // DHKEM(X25519, HKDF-SHA256)
const HPKE_SUITE: &[u8] = b"HPKE\x00\x20\x00\x01\x00\x01"; // + HKDF-SHA256, AES-128-GCM

/// Per-record outcome; the Python opener (`ldp_core.wire.sealing`) uses the same numbers.
const OPENED: u8 = 0;
const UNKNOWN_KEY: u8 = 1; // a key id this ring does not hold (or fewer than 4 bytes left)
const BAD_POINT: u8 = 2; // the X25519 exchange refused enc (all-zero shared secret)
const NOT_AUTHENTIC: u8 = 3; // the AEAD tag does not verify: altered bytes, other metric/spec/day/key
const WRONG_SIZE: u8 = 4; // opened, but not `plain_size` bytes
const SHORT: u8 = 5; // fewer bytes than enc and a tag

struct Len(usize);

impl KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn labeled_extract(suite: &[u8], salt: &[u8], label: &[u8], ikm: &[u8]) -> Prk {
    let zeros = [0u8; NH];
    let salt = if salt.is_empty() { &zeros[..] } else { salt };
    let labeled = [V1, suite, label, ikm].concat();
    Salt::new(HKDF_SHA256, salt).extract(&labeled)
}

fn labeled_expand<const L: usize>(suite: &[u8], prk: &Prk, label: &[u8], info: &[u8]) -> [u8; L] {
    let len = (L as u16).to_be_bytes();
    let mut out = [0u8; L];
    prk.expand(&[&len, V1, suite, label, info], Len(L))
        .and_then(|okm| okm.fill(&mut out))
        .expect("HKDF-SHA256 expands up to 8160 bytes");
    out
}

fn prk_bytes(suite: &[u8], salt: &[u8], label: &[u8], ikm: &[u8]) -> [u8; NH] {
    // LabeledExtract's output as bytes (psk_id_hash, info_hash): aws-lc-rs's Prk does not expose them, so this
    // extract is computed as the HMAC it is (RFC 5869 §2.2: PRK = HMAC-Hash(salt, IKM))
    use aws_lc_rs::hmac;
    let zeros = [0u8; NH];
    let salt = if salt.is_empty() { &zeros[..] } else { salt };
    let key = hmac::Key::new(hmac::HMAC_SHA256, salt);
    let mut ctx = hmac::Context::with_key(&key);
    for part in [V1, suite, label, ikm] {
        ctx.update(part);
    }
    ctx.sign()
        .as_ref()
        .try_into()
        .expect("HMAC-SHA256 is 32 bytes")
}

struct RingKey {
    kid: [u8; KEY_ID],
    sk: PrivateKey,
    pk: [u8; NENC],
}

/// One key's constants for one `info`: the key schedule context (RFC 9180 §5.1, mode base, empty PSK).
struct Schedule<'a> {
    key: &'a RingKey,
    ksc: Vec<u8>,
}

impl RingKey {
    fn open(&self, ksc: &[u8], msg: &[u8], plain_size: usize, out: &mut Vec<u8>) -> u8 {
        if msg.len() < NENC + NT {
            return SHORT;
        }
        let (enc, ct) = msg.split_at(NENC);
        let peer = UnparsedPublicKey::new(&X25519, enc);
        let mut dh = [0u8; NH];
        if agree(&self.sk, peer, (), |s| {
            dh.copy_from_slice(s);
            Ok(())
        })
        .is_err()
        {
            return BAD_POINT;
        }
        // DHKEM's ExtractAndExpand (§4.1): kem_context = enc || pkR
        let eae_prk = labeled_extract(KEM_SUITE, b"", b"eae_prk", &dh);
        let mut kem_context = [0u8; 2 * NENC];
        kem_context[..NENC].copy_from_slice(enc);
        kem_context[NENC..].copy_from_slice(&self.pk);
        let shared_secret: [u8; NH] =
            labeled_expand(KEM_SUITE, &eae_prk, b"shared_secret", &kem_context);
        // KeySchedule (§5.1): secret = LabeledExtract(shared_secret, "secret", psk = "")
        let secret = labeled_extract(HPKE_SUITE, &shared_secret, b"secret", b"");
        let key: [u8; NK] = labeled_expand(HPKE_SUITE, &secret, b"key", ksc);
        let nonce: [u8; NN] = labeled_expand(HPKE_SUITE, &secret, b"base_nonce", ksc);
        let aead = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key).expect("16-byte key"));
        let mut buf = ct.to_vec();
        match aead.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf) {
            Ok(pt) if pt.len() == plain_size => {
                out.extend_from_slice(pt);
                OPENED
            }
            Ok(_) => WRONG_SIZE,
            Err(_) => NOT_AUTHENTIC,
        }
    }
}

/// The analyzer's private keys, by key id; `open` opens a batch of one (metric, spec, day).
#[pyclass(name = "Opener", module = "ldp_opener", frozen)]
struct Opener {
    keys: Vec<RingKey>,
}

#[pymethods]
impl Opener {
    /// `keys`: (key id: 4 bytes, raw X25519 private key: 32 bytes) for each key of the ring.
    #[new]
    fn new(keys: Vec<(Vec<u8>, Vec<u8>)>) -> PyResult<Self> {
        let mut ring = Vec::with_capacity(keys.len());
        for (kid, sk) in keys {
            let kid: [u8; KEY_ID] = kid
                .as_slice()
                .try_into()
                .map_err(|_| PyValueError::new_err(format!("a key id is {KEY_ID} bytes")))?;
            if sk.len() != 32 {
                return Err(PyValueError::new_err("an X25519 private key is 32 bytes"));
            }
            let sk = PrivateKey::from_private_key(&X25519, &sk)
                .map_err(|_| PyValueError::new_err("unusable X25519 private key"))?;
            let pk: [u8; NENC] = sk
                .compute_public_key()
                .map_err(|_| PyValueError::new_err("unusable X25519 private key"))?
                .as_ref()
                .try_into()
                .map_err(|_| PyValueError::new_err("unexpected X25519 public key size"))?;
            ring.push(RingKey { kid, sk, pk });
        }
        Ok(Self { keys: ring })
    }

    /// Open the records of `data` (back to back, `width` bytes each; a shorter last one is opened as it
    /// is) for `infos` (key id -> HPKE info, one per key the records may name). Returns the plaintexts
    /// of the records that opened (concatenated, in order), their enc values (32 bytes each) and one
    /// status byte per record (0 opened, 1 unknown key id, 2 refused X25519 point, 3 not authentic,
    /// 4 wrong plaintext size, 5 too short).
    fn open<'py>(
        &self,
        py: Python<'py>,
        data: PyBackedBytes,
        width: usize,
        plain_size: usize,
        infos: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        if width == 0 {
            return Err(PyValueError::new_err("width must be positive"));
        }
        let (plain, encs, status) = py.detach(|| {
            let psk_id_hash = prk_bytes(HPKE_SUITE, b"", b"psk_id_hash", b"");
            let schedules: Vec<(Vec<u8>, Schedule)> = infos
                .iter()
                .filter_map(|(kid, info)| {
                    let key = self.keys.iter().find(|k| k.kid[..] == kid[..])?;
                    let info_hash = prk_bytes(HPKE_SUITE, b"", b"info_hash", info);
                    let mut ksc = Vec::with_capacity(1 + 2 * NH);
                    ksc.push(0u8); // mode_base
                    ksc.extend_from_slice(&psk_id_hash);
                    ksc.extend_from_slice(&info_hash);
                    Some((kid.clone(), Schedule { key, ksc }))
                })
                .collect();
            let n = data.len().div_ceil(width);
            let mut plain = Vec::with_capacity(n * plain_size);
            let mut encs = Vec::with_capacity(n * NENC);
            let mut status = Vec::with_capacity(n);
            for rec in data.chunks(width) {
                let kid = &rec[..rec.len().min(KEY_ID)];
                let s = match schedules.iter().find(|(k, _)| k[..] == kid[..]) {
                    None => UNKNOWN_KEY,
                    Some((_, sch)) => {
                        sch.key
                            .open(&sch.ksc, &rec[KEY_ID..], plain_size, &mut plain)
                    }
                };
                if s == OPENED {
                    encs.extend_from_slice(&rec[KEY_ID..KEY_ID + NENC]);
                }
                status.push(s);
            }
            (plain, encs, status)
        });
        Ok((
            PyBytes::new(py, &plain),
            PyBytes::new(py, &encs),
            PyBytes::new(py, &status),
        ))
    }
}

#[pymodule]
fn ldp_opener(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Opener>()?;
    Ok(())
}
