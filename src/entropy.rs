//! Where ids and lease tokens come from: the OS in production, a seed in tests and
//! in simulation. The engine never mints either.

use leasehold_engine::LeaseToken;
use std::sync::Mutex;

/// The kinds of id a ledger mints; each has its own prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// A plan (`pln-`).
    Plan,
    /// An attempt (`att-`).
    Attempt,
    /// A command (`cmd-`).
    Command,
}

impl IdKind {
    fn prefix(self) -> &'static str {
        match self {
            IdKind::Plan => "pln",
            IdKind::Attempt => "att",
            IdKind::Command => "cmd",
        }
    }
}

/// A source of fresh ids and lease tokens.
pub trait Entropy: Send + Sync + 'static {
    /// 64 fresh bits.
    fn next_u64(&self) -> u64;

    /// A fresh id of this kind, e.g. `att-3f9a0c1d2b4e5f60`.
    fn id(&self, kind: IdKind) -> String {
        format!("{}-{:016x}", kind.prefix(), self.next_u64())
    }

    /// A fresh lease token (128 bits).
    fn token(&self) -> LeaseToken {
        LeaseToken::new(format!("{:016x}{:016x}", self.next_u64(), self.next_u64()))
    }
}

/// The operating system's random number generator.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn next_u64(&self) -> u64 {
        let mut bytes = [0u8; 8];
        // getrandom only fails when the OS has no entropy source at all; there is no
        // safe way to mint a lease token then.
        getrandom::getrandom(&mut bytes).expect("the operating system's random source is unavailable");
        u64::from_le_bytes(bytes)
    }

    /// `att-0193a5b2c3d4-3f9a0c1d2b4e5f60`: the milliseconds since the Unix epoch (48
    /// bits, hexadecimal), then 64 random bits. Ids minted later sort after those minted
    /// before, so the indexes keyed by them grow at their end and a run of deliveries
    /// touches neighbouring index pages instead of pages all over a large ledger; the
    /// random part keeps ids of the same millisecond (and of different processes) apart.
    fn id(&self, kind: IdKind) -> String {
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        format!(
            "{}-{:012x}-{:016x}",
            kind.prefix(),
            millis & 0xffff_ffff_ffff,
            self.next_u64()
        )
    }

    /// The same 128 bits as the default, drawn from the OS in one call instead of
    /// two (a claim mints one token per command).
    fn token(&self) -> LeaseToken {
        let mut bytes = [0u8; 16];
        getrandom::getrandom(&mut bytes).expect("the operating system's random source is unavailable");
        let (high, low) = bytes.split_at(8);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("eight bytes"));
        LeaseToken::new(format!("{:016x}{:016x}", word(high), word(low)))
    }
}

/// A deterministic generator (splitmix64) for tests and simulation.
#[derive(Debug)]
pub struct SeededEntropy(Mutex<u64>);

impl SeededEntropy {
    /// A generator whose whole output follows from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(Mutex::new(seed))
    }
}

impl Entropy for SeededEntropy {
    fn next_u64(&self) -> u64 {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl<E: Entropy + ?Sized> Entropy for std::sync::Arc<E> {
    fn next_u64(&self) -> u64 {
        (**self).next_u64()
    }

    fn id(&self, kind: IdKind) -> String {
        (**self).id(kind)
    }

    fn token(&self) -> LeaseToken {
        (**self).token()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_entropy_repeats_for_the_same_seed() {
        let (a, b) = (SeededEntropy::new(7), SeededEntropy::new(7));
        assert_eq!(a.id(IdKind::Attempt), b.id(IdKind::Attempt));
        assert_ne!(a.id(IdKind::Attempt), SeededEntropy::new(8).id(IdKind::Attempt));
        assert!(a.id(IdKind::Plan).starts_with("pln-"));
    }

    /// An `Arc<dyn Entropy>` used as `&dyn Entropy` (the SQLite writer's path) must
    /// mint with the inner source's own `id` and `token`, not the trait's defaults.
    #[test]
    fn an_arc_forwards_every_method() {
        struct Own;
        impl Entropy for Own {
            fn next_u64(&self) -> u64 {
                1
            }
            fn id(&self, kind: IdKind) -> String {
                format!("own-{}", kind.prefix())
            }
            fn token(&self) -> LeaseToken {
                LeaseToken::new("own-token")
            }
        }
        let shared: std::sync::Arc<dyn Entropy> = std::sync::Arc::new(Own);
        let used: &dyn Entropy = &shared;
        assert_eq!(used.next_u64(), 1);
        assert_eq!(used.id(IdKind::Command), "own-cmd");
        assert_eq!(used.token(), LeaseToken::new("own-token"));
    }

    #[test]
    fn os_ids_start_with_the_millisecond_they_were_minted_in() {
        let now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis() as u64
        };
        let before = now();
        let (first, second) = (OsEntropy.id(IdKind::Attempt), OsEntropy.id(IdKind::Attempt));
        let after = now();
        for id in [&first, &second] {
            let parts: Vec<&str> = id.split('-').collect();
            assert_eq!(parts.len(), 3, "{id}");
            assert_eq!(parts[0], "att");
            assert_eq!((parts[1].len(), parts[2].len()), (12, 16), "{id}");
            let millis = u64::from_str_radix(parts[1], 16).expect("hexadecimal milliseconds");
            assert!((before..=after).contains(&millis), "{id}: {before}..={after}");
            u64::from_str_radix(parts[2], 16).expect("hexadecimal random part");
        }
        assert_ne!(first, second);
        let later = OsEntropy.id(IdKind::Attempt);
        assert!(later[..16] >= second[..16], "{later} sorts before {second}");
    }

    #[test]
    fn os_tokens_differ() {
        assert_ne!(OsEntropy.token(), OsEntropy.token());
    }
}
