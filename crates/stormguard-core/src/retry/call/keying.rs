//! Keying: the seeded draws of one call (its backoff jitter, its idempotency key) and the
//! budget key its retries are charged to.

use super::CallRetry;
use crate::wire::UuidKey;
use crate::wire::uuid_v4;

/// Mixed into the seed of a call's idempotency key, so the key and the call's backoff
/// jitter (seeded from the same call number) are unrelated draws.
const KEY_SALT: u64 = 0x1DE4_907E_4C1E_5EED;

/// A 64-bit mixer, so that consecutive call numbers give unrelated seeds.
pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl CallRetry {
    /// The idempotency key drawn for this call when its method is keyed
    /// ([`MethodTable::idempotency_key`](crate::MethodTable::idempotency_key)): a UUID v4 from the controller's seeded RNG, which
    /// every attempt and hedge carries as `idempotency-key` (the layer keeps a key the caller
    /// set instead). A keyed call is retried after it may have run, as an idempotent one is:
    /// the server that recognises the key answers a repeat with what the first run answered.
    /// `None`: the method is not keyed.
    pub fn idempotency_key(&self) -> Option<&UuidKey> {
        self.idempotency_key.as_ref()
    }

    /// Whether the method is keyed (see [`idempotency_key`](Self::idempotency_key)).
    pub(crate) fn is_keyed(&self) -> bool {
        self.idempotency_key.is_some()
    }

    /// The attempt that just ended went to `key` (the replica the channel chose, or the
    /// request's shard): its success deposits into `key`'s account as well as the shared
    /// budget, and a retry after its failure is charged to `key`'s account too (see
    /// [`KeyedBudgets`](crate::KeyedBudgets)). `None`: the shared budget only. Set it after each attempt ends,
    /// before reporting how it ended.
    pub fn set_budget_key(&mut self, key: Option<u64>) {
        self.key = key;
    }
}

/// The seed of call `n`'s backoff jitter under the controller's `seed`.
pub(in crate::retry) fn backoff_seed(seed: u64, n: u64) -> u64 {
    splitmix64(seed ^ splitmix64(n))
}

/// The idempotency key of call `n` under the controller's `seed`: a draw unrelated to the
/// call's backoff jitter (see [`KEY_SALT`]).
pub(in crate::retry) fn call_key(seed: u64, n: u64) -> UuidKey {
    let mut rng = fastrand::Rng::with_seed(splitmix64(seed ^ KEY_SALT ^ splitmix64(n)));
    uuid_v4(rng.u128(..))
}

/// The seed of the breaker's open-duration jitter under the controller's `seed`.
pub(in crate::retry) fn breaker_seed(seed: u64) -> u64 {
    splitmix64(seed ^ 0x0B2E_A4E2)
}

/// The seed of the connection backoff's jitter.
pub(in crate::retry) fn connect_seed(seed: u64) -> u64 {
    splitmix64(seed ^ 0xC044_EC70)
}
