//! A thin PyO3 binding over Divvi Up's `prio` crate (VDAF draft 18, Prio3).
//!
//! Nothing cryptographic lives here: every field operation, proof and XOF call is the crate's.
//! The binding only moves bytes across the language boundary.  Every message (public share,
//! input share, verify state, verifier share and message, output share, aggregate share) crosses
//! in the crate's own TLS-style encoding, so the Python side can store, seal and send them as
//! opaque bytes and the aggregators keep no Rust object alive between HTTP calls.

use prio::codec::{Encode, ParameterizedDecode};
use prio::dp::distributions::DiscreteLaplace;
use prio::dp::Rational;
use prio::field::FieldElementWithInteger;
use prio::vdaf::prio3::{Prio3, Prio3Count, Prio3Histogram, Prio3Sum, Prio3SumVec};
use prio::vdaf::xof::SeedStreamTurboShake128;
use prio::vdaf::AggregateShare;
use rand::distr::Distribution;
use rand::SeedableRng;
use prio::vdaf::test_utils::TestVectorClient;
use prio::vdaf::{Aggregatable, Aggregator, Client, Collector, VerifyTransition};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pyo3::create_exception!(ldp_prio3, VdafError, pyo3::exceptions::PyException);

const NONCE: usize = 16;
const SEED: usize = 32;

fn verr<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> PyErr + '_ {
    move |e| VdafError::new_err(format!("{what}: {e}"))
}

fn nonce_of(nonce: &[u8]) -> PyResult<[u8; NONCE]> {
    nonce
        .try_into()
        .map_err(|_| PyValueError::new_err(format!("nonce must be {NONCE} bytes")))
}

fn key_of(key: &[u8]) -> PyResult<[u8; SEED]> {
    key.try_into()
        .map_err(|_| PyValueError::new_err(format!("verify key must be {SEED} bytes")))
}

fn enc<T: Encode>(py: Python<'_>, what: &str, v: &T) -> PyResult<Py<PyBytes>> {
    let b = v.get_encoded().map_err(verr(what))?;
    Ok(PyBytes::new(py, &b).unbind())
}

type Sharded = (Py<PyBytes>, Vec<Py<PyBytes>>);

/// `share + noise`, element by element, each signed integer mapped into the field (the crate's
/// field arithmetic; `|noise|` must be below the modulus).
fn add_signed<F>(share: &AggregateShare<F>, noise: &[i128]) -> PyResult<AggregateShare<F>>
where
    F: FieldElementWithInteger,
    F::Integer: TryFrom<u128> + Into<u128>,
{
    let elems: &[F] = share.as_ref();
    if elems.len() != noise.len() {
        return Err(PyValueError::new_err(format!(
            "noise has {} values, the aggregate share {}",
            noise.len(),
            elems.len()
        )));
    }
    let p: u128 = F::modulus().into();
    elems
        .iter()
        .zip(noise)
        .map(|(x, n)| {
            let mag = n.unsigned_abs();
            if mag >= p / 2 {
                return Err(PyValueError::new_err("noise value too large for the field"));
            }
            let m = F::from(F::Integer::try_from(mag).map_err(|_| PyValueError::new_err("noise value"))?);
            Ok(if *n < 0 { *x - m } else { *x + m })
        })
        .collect::<PyResult<Vec<F>>>()
        .map(AggregateShare::from)
}

/// The field elements of `share` as signed integers: x if x <= p/2, else x - p.
fn centered<F>(share: &AggregateShare<F>) -> Vec<i128>
where
    F: FieldElementWithInteger,
    F::Integer: Into<u128>,
{
    let p: u128 = F::modulus().into();
    share
        .as_ref()
        .iter()
        .map(|x| {
            let v: u128 = F::Integer::from(*x).into();
            if v > p / 2 {
                -((p - v) as i128)
            } else {
                v as i128
            }
        })
        .collect()
}

macro_rules! prio3_class {
    ($pyname:ident, $name:literal, $vdaf:ty, $meas_py:ty, $to_meas:expr, $res_py:ty,
     new($($arg:ident: $argty:ty),*) => $ctor:expr) => {
        #[pyclass(name = $name, module = "ldp_prio3", frozen)]
        struct $pyname {
            vdaf: $vdaf,
        }

        impl $pyname {
            fn state(&self, agg_id: usize, state: &[u8]) -> PyResult<<$vdaf as prio::vdaf::Aggregator<SEED, NONCE>>::VerifyState> {
                ParameterizedDecode::get_decoded_with_param(&(&self.vdaf, agg_id), state)
                    .map_err(verr("verify state"))
            }

            fn agg_share(&self, b: &[u8]) -> PyResult<<$vdaf as prio::vdaf::Vdaf>::AggregateShare> {
                ParameterizedDecode::get_decoded_with_param(&(&self.vdaf, &()), b)
                    .map_err(verr("aggregate share"))
            }

            fn split(
                &self,
                py: Python<'_>,
                public: <$vdaf as prio::vdaf::Vdaf>::PublicShare,
                inputs: Vec<<$vdaf as prio::vdaf::Vdaf>::InputShare>,
            ) -> PyResult<Sharded> {
                let shares = inputs
                    .iter()
                    .map(|s| enc(py, "input share", s))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok((enc(py, "public share", &public)?, shares))
            }
        }

        #[pymethods]
        impl $pyname {
            #[new]
            fn new($($arg: $argty),*) -> PyResult<Self> {
                Ok(Self { vdaf: $ctor.map_err(verr($name))? })
            }

            /// Client: split `measurement` into a public share and one input share per aggregator.
            fn shard(&self, py: Python<'_>, measurement: $meas_py, nonce: &[u8], ctx: &[u8]) -> PyResult<Sharded> {
                let m = $to_meas(measurement)?;
                let n = nonce_of(nonce)?;
                let (public, inputs) = py
                    .detach(|| self.vdaf.shard(ctx, &m, &n))
                    .map_err(verr("shard"))?;
                self.split(py, public, inputs)
            }

            /// Client with fixed randomness: only for the published test vectors.
            fn shard_with_random(
                &self,
                py: Python<'_>,
                measurement: $meas_py,
                nonce: &[u8],
                rand: &[u8],
                ctx: &[u8],
            ) -> PyResult<Sharded> {
                let m = $to_meas(measurement)?;
                let n = nonce_of(nonce)?;
                let (public, inputs) = self
                    .vdaf
                    .shard_with_random(ctx, &m, &n, rand)
                    .map_err(verr("shard"))?;
                self.split(py, public, inputs)
            }

            /// Aggregator `agg_id`: decode its input share and start verification.
            /// Returns (verify state, verifier share).
            #[allow(clippy::too_many_arguments)]
            fn verify_init(
                &self,
                py: Python<'_>,
                verify_key: &[u8],
                ctx: &[u8],
                agg_id: usize,
                nonce: &[u8],
                public_share: &[u8],
                input_share: &[u8],
            ) -> PyResult<(Py<PyBytes>, Py<PyBytes>)> {
                if agg_id >= 2 {
                    return Err(PyValueError::new_err("agg_id must be 0 (leader) or 1 (helper)"));
                }
                let key = key_of(verify_key)?;
                let n = nonce_of(nonce)?;
                let public = ParameterizedDecode::get_decoded_with_param(&self.vdaf, public_share)
                    .map_err(verr("public share"))?;
                let input = ParameterizedDecode::get_decoded_with_param(&(&self.vdaf, agg_id), input_share)
                    .map_err(verr("input share"))?;
                let (state, share) = self
                    .vdaf
                    .verify_init(&key, ctx, agg_id, &(), &n, &public, &input)
                    .map_err(verr("verify_init"))?;
                Ok((enc(py, "verify state", &state)?, enc(py, "verifier share", &share)?))
            }

            /// Combine every aggregator's verifier share into the verifier message.  `state` is any
            /// aggregator's verify state for this report (it only fixes the decoding lengths).
            fn verifier_shares_to_message(
                &self,
                py: Python<'_>,
                ctx: &[u8],
                agg_id: usize,
                state: &[u8],
                shares: Vec<Vec<u8>>,
            ) -> PyResult<Py<PyBytes>> {
                let st = self.state(agg_id, state)?;
                let decoded = shares
                    .iter()
                    .map(|b| ParameterizedDecode::get_decoded_with_param(&st, b).map_err(verr("verifier share")))
                    .collect::<PyResult<Vec<_>>>()?;
                let msg = self
                    .vdaf
                    .verifier_shares_to_message(ctx, &(), decoded)
                    .map_err(verr("verifier_shares_to_message"))?;
                enc(py, "verifier message", &msg)
            }

            /// Finish verification with the verifier message: returns the output share.
            fn verify_next(
                &self,
                py: Python<'_>,
                ctx: &[u8],
                agg_id: usize,
                state: &[u8],
                message: &[u8],
            ) -> PyResult<Py<PyBytes>> {
                let st = self.state(agg_id, state)?;
                let msg = ParameterizedDecode::get_decoded_with_param(&st, message)
                    .map_err(verr("verifier message"))?;
                match self.vdaf.verify_next(ctx, st, msg).map_err(verr("verify_next"))? {
                    VerifyTransition::Finish(out) => enc(py, "output share", &out),
                    VerifyTransition::Continue(..) => Err(VdafError::new_err("Prio3 verifies in one round")),
                }
            }

            /// Sum output shares into one aggregate share.
            fn aggregate(&self, py: Python<'_>, output_shares: Vec<Vec<u8>>) -> PyResult<Py<PyBytes>> {
                let outs = output_shares
                    .iter()
                    .map(|b| {
                        ParameterizedDecode::get_decoded_with_param(&(&self.vdaf, &()), b)
                            .map_err(verr("output share"))
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                let agg = self.vdaf.aggregate(&(), outs).map_err(verr("aggregate"))?;
                enc(py, "aggregate share", &agg)
            }

            /// Merge aggregate shares of the same aggregator (for example, from two batches).
            fn merge(&self, py: Python<'_>, aggregate_shares: Vec<Vec<u8>>) -> PyResult<Py<PyBytes>> {
                let mut acc = self.vdaf.aggregate_init(&());
                for b in &aggregate_shares {
                    acc.merge(&self.agg_share(b)?).map_err(verr("merge"))?;
                }
                enc(py, "aggregate share", &acc)
            }

            /// Collector: combine both aggregators' aggregate shares into the aggregate result.
            fn unshard(&self, aggregate_shares: Vec<Vec<u8>>, num_measurements: usize) -> PyResult<$res_py> {
                let shares = aggregate_shares
                    .iter()
                    .map(|b| self.agg_share(b))
                    .collect::<PyResult<Vec<_>>>()?;
                let r = self
                    .vdaf
                    .unshard(&(), shares, num_measurements)
                    .map_err(verr("unshard"))?;
                Ok(r)
            }

            /// Add signed integer noise to an aggregate share, one value per element (an aggregator's
            /// central-DP noise, added before it releases the share).
            fn add_to_aggregate_share(&self, py: Python<'_>, aggregate_share: &[u8], noise: Vec<i128>) -> PyResult<Py<PyBytes>> {
                let share = self.agg_share(aggregate_share)?;
                enc(py, "aggregate share", &add_signed(&share, &noise)?)
            }

            /// Collector: sum both aggregators' aggregate shares and read each element as a signed
            /// integer (x - p above p/2), for results that carry noise and may be negative.
            /// Without noise this equals `unshard` for the four types here (whose aggregate result
            /// is the aggregate share's elements, unchanged).
            fn unshard_signed(&self, aggregate_shares: Vec<Vec<u8>>) -> PyResult<Vec<i128>> {
                let mut acc = self.vdaf.aggregate_init(&());
                for b in &aggregate_shares {
                    acc.merge(&self.agg_share(b)?).map_err(verr("merge"))?;
                }
                Ok(centered(&acc))
            }

            #[getter]
            fn algorithm_id(&self) -> u32 {
                use prio::vdaf::Vdaf;
                self.vdaf.algorithm_id()
            }
        }
    };
}

fn count_meas(m: u64) -> PyResult<bool> {
    match m {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(PyValueError::new_err("a Prio3Count measurement is 0 or 1")),
    }
}

fn ok<T>(v: T) -> PyResult<T> {
    Ok(v)
}

prio3_class!(PyCount, "Prio3Count", Prio3Count, u64, count_meas, u64,
    new() => Prio3::new_count(2));
prio3_class!(PySum, "Prio3Sum", Prio3Sum, u64, ok, u64,
    new(max_measurement: u64) => Prio3::new_sum(2, max_measurement));
prio3_class!(PyHistogram, "Prio3Histogram", Prio3Histogram, usize, ok, Vec<u128>,
    new(length: usize, chunk_length: usize) => Prio3::new_histogram(2, length, chunk_length));
prio3_class!(PySumVec, "Prio3SumVec", Prio3SumVec, Vec<u128>, ok, Vec<u128>,
    new(max_measurement: u128, length: usize, chunk_length: usize) =>
        Prio3::new_sum_vec(2, max_measurement, length, chunk_length));

/// `n` samples of the discrete Laplace distribution of scale `scale_num / scale_den` (the crate's
/// exact sampler, [CKS20]), drawn from TurboSHAKE128 seeded with the 32-byte `seed`: the caller
/// passes OS randomness (`secrets.token_bytes(32)`), or a fixed seed in tests.
#[pyfunction]
fn discrete_laplace(py: Python<'_>, scale_num: u128, scale_den: u128, n: usize, seed: &[u8]) -> PyResult<Vec<i128>> {
    let seed: [u8; SEED] = seed
        .try_into()
        .map_err(|_| PyValueError::new_err(format!("seed must be {SEED} bytes")))?;
    let scale = Rational::from_unsigned(scale_num, scale_den).map_err(verr("scale"))?;
    let dist = DiscreteLaplace::new(scale).map_err(verr("discrete Laplace"))?;
    py.detach(|| {
        let mut rng = SeedStreamTurboShake128::from_seed(seed);
        (0..n)
            .map(|_| i128::try_from(dist.sample(&mut rng)).map_err(|_| PyValueError::new_err("sample out of range")))
            .collect()
    })
}

#[pymodule]
fn ldp_prio3(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCount>()?;
    m.add_class::<PySum>()?;
    m.add_class::<PyHistogram>()?;
    m.add_class::<PySumVec>()?;
    m.add_function(wrap_pyfunction!(discrete_laplace, m)?)?;
    m.add("VdafError", m.py().get_type::<VdafError>())?;
    m.add("PRIO_VERSION", "0.18.1")?;
    m.add("VDAF_DRAFT", 18)?;
    Ok(())
}
