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
/// `words!(serde Ty { … })` also makes the words its serde form (stored data and config read
/// and write the same words the table names, and nothing else).
#[macro_export]
macro_rules! words {
    (serde $ty:ident { $($v:ident = $w:literal),+ $(,)? }) => {
        $crate::words!($ty { $($v = $w),+ });

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let word = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                Self::from_word(&word)
                    .ok_or_else(|| serde::de::Error::unknown_variant(&word, Self::WORDS))
            }
        }
    };
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
