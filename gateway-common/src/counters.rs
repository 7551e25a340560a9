//! Counter structs that describe their own fields once: the struct, its per-CPU sum, and a table
//! of its fields (name and help), from which the JSON of `gateway stats`, its table and the
//! Prometheus series all follow. A new counter is one line of a [`counters!`] block.

/// One `u64` field of a counter struct.
pub struct CounterField<T> {
    /// The field's name: the JSON key and the Prometheus name's suffix; the table shows it
    /// with dashes.
    pub name: &'static str,
    /// What it counts (the field's doc comment).
    pub help: &'static str,
    /// Reads the field.
    pub get: fn(&T) -> u64,
}

impl<T> CounterField<T> {
    /// The help text, without the doc comment's leading spaces.
    pub fn help(&self) -> &'static str {
        self.help.trim()
    }

    /// The name as the table shows it (`multi-segment`).
    pub fn label(&self) -> impl core::fmt::Display + '_ {
        Dashed(self.name)
    }
}

struct Dashed<'a>(&'a str);

impl core::fmt::Display for Dashed<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for part in self.0.split('_').enumerate() {
            if part.0 > 0 {
                f.write_str("-")?;
            }
            f.write_str(part.1)?;
        }
        Ok(())
    }
}

/// A counter struct made by [`counters!`].
pub trait Counters: Sized + 'static {
    /// Every field, in declaration order.
    const FIELDS: &'static [CounterField<Self>];
}

/// Declares a `#[repr(C)]` struct of `u64` counters with `accumulate` (adds another CPU's
/// counters) and [`Counters::FIELDS`], each field's help being its doc comment.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                #[doc = $help:literal]
                $(#[doc = $more:literal])*
                pub $field:ident: u64,
            )*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $(
                #[doc = $help]
                $(#[doc = $more])*
                pub $field: u64,
            )*
        }

        impl $name {
            /// Adds another CPU's counters to these.
            pub fn accumulate(&mut self, other: &Self) {
                $( self.$field += other.$field; )*
            }
        }

        impl $crate::counters::Counters for $name {
            const FIELDS: &'static [$crate::counters::CounterField<Self>] = &[
                $(
                    $crate::counters::CounterField {
                        name: stringify!($field),
                        help: concat!($help $(, $more)*),
                        get: |c: &Self| c.$field,
                    },
                )*
            ];
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString as _;

    crate::counters! {
        /// Test counters.
        pub struct Sample {
            /// Hellos that took more than
            /// one segment.
            pub multi_segment: u64,
            /// Other.
            pub other: u64,
        }
    }

    #[test]
    fn fields_describe_themselves_and_sum_across_cpus() {
        let mut a = Sample {
            multi_segment: 1,
            other: 2,
        };
        a.accumulate(&Sample {
            multi_segment: 10,
            other: 20,
        });
        let f = Sample::FIELDS;
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].name, "multi_segment");
        assert_eq!(f[0].help(), "Hellos that took more than one segment.");
        assert_eq!(f[0].label().to_string(), "multi-segment");
        assert_eq!((f[0].get)(&a), 11);
        assert_eq!((f[1].get)(&a), 22);
    }
}
