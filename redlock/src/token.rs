//! Lock tokens: 128 random bits from the OS CSPRNG, shown redacted.

use std::fmt;
use std::sync::Arc;

use crate::error::EntropyError;

/// Number of random bytes in a generated token (128 bits).
pub const TOKEN_BYTES: usize = 16;

/// Characters of a token that `Debug`/`Display` reveal; the rest is elided.
const SHOWN_CHARS: usize = 6;

/// The secret value that proves ownership of a lock on every node.
///
/// A token is generated per acquisition attempt from the operating system's CSPRNG
/// (`getrandom`), [`TOKEN_BYTES`] bytes rendered as lowercase hex. Cloning is cheap.
///
/// `Debug` and `Display` show only a short prefix (`3fa9c1…`) so that logs and error
/// messages never carry a full token; [`Token::expose`] returns the whole value for callers
/// that must persist it (for example to re-claim their own lock after a restart with
/// [`Redlock::try_acquire_with_token`](crate::Redlock::try_acquire_with_token)).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Arc<str>);

impl Token {
    /// A fresh random token.
    ///
    /// # Errors
    /// Fails only when the operating system's random source is unavailable.
    pub fn random() -> Result<Self, EntropyError> {
        let mut bytes = [0u8; TOKEN_BYTES];
        crate::det::fill(&mut bytes).map_err(|e| EntropyError::new(&e))?;
        let mut hex = [0u8; TOKEN_BYTES * 2];
        for (pair, b) in hex.chunks_exact_mut(2).zip(bytes) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0x0f)];
        }
        // Hex digits are ASCII: the lossy conversion borrows and never replaces anything.
        Ok(Self(Arc::from(&*String::from_utf8_lossy(&hex))))
    }

    /// Wraps a token that was previously obtained from [`Token::expose`].
    ///
    /// Returns `None` for values that cannot have come from this crate: fewer than 32 or more
    /// than 256 characters, or characters outside `[0-9a-zA-Z_-]`.
    pub fn from_secret(secret: &str) -> Option<Self> {
        let ok_len = (TOKEN_BYTES * 2..=256).contains(&secret.len());
        let ok_chars = secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        (ok_len && ok_chars).then(|| Self(secret.into()))
    }

    /// The full secret value. Keep it out of logs.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A short, non-secret prefix for logs and messages.
    pub fn short(&self) -> &str {
        &self.0[..SHOWN_CHARS.min(self.0.len())]
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}…)", self.short())
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.short())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_redacted() {
        let a = Token::random().unwrap();
        let b = Token::random().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 32);
        let shown = format!("{a:?} {a}");
        assert!(!shown.contains(a.expose()), "{shown}");
        assert!(shown.contains(a.short()));
    }

    #[test]
    fn from_secret_round_trips_and_rejects_junk() {
        let a = Token::random().unwrap();
        assert_eq!(Token::from_secret(a.expose()), Some(a));
        assert_eq!(Token::from_secret(""), None);
        assert_eq!(Token::from_secret("short"), None);
        assert_eq!(Token::from_secret(&"x".repeat(257)), None);
        assert_eq!(Token::from_secret(&format!("{}\"", "a".repeat(40))), None);
    }
}
