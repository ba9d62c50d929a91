//! Enums spelled as words (in config, store rows and output): one table per enum, given to
//! [`crate::words!`], is the only place a variant's word is written.

/// An enum whose values are words (implemented by [`crate::words!`]), for code generic over
/// such enums (config's parsing).
pub trait Words: Sized {
    /// Every word, in the table's order.
    const WORDS: &'static [&'static str];
    /// The value `word` names; `None` for any other word.
    fn from_word(word: &str) -> Option<Self>;
}

/// `words!(Mode { Independent = "independent", … })` gives a data-less enum `WORDS` (in the
/// table's order), `as_str`, `from_word` (`None` for any other word), `Display` and [`Words`].
#[macro_export]
macro_rules! words {
    ($ty:ident { $($v:ident = $w:literal),+ $(,)? }) => {
        impl $ty {
            pub const WORDS: &'static [&'static str] = &[$($w),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$v => $w),+
                }
            }

            pub fn from_word(word: &str) -> Option<Self> {
                match word {
                    $($w => Some(Self::$v),)+
                    _ => None,
                }
            }
        }

        impl $crate::words::Words for $ty {
            const WORDS: &'static [&'static str] = <$ty>::WORDS;

            fn from_word(word: &str) -> Option<Self> {
                <$ty>::from_word(word)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
