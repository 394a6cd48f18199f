//! Settings that configs, command lines and reports spell by name (mode, forwarding,
//! policy): how a name is looked up, and the error for one that names nothing.

use std::fmt;

/// A name that is none of a setting's names; says which names there are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    /// What was being named, e.g. `mode`.
    pub setting: &'static str,
    pub given: String,
    pub names: Vec<&'static str>,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}: use ", self.setting, self.given)?;
        let last = self.names.len().saturating_sub(1);
        for (i, name) in self.names.iter().enumerate() {
            let separator = match i {
                0 => "",
                _ if i == last => " or ",
                _ => ", ",
            };
            write!(f, "{separator}{name}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownName {}

/// The member of `all` called `given`.
pub(crate) fn find_by_name<T: Copy>(
    setting: &'static str,
    given: &str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T, UnknownName> {
    all.iter()
        .copied()
        .find(|member| name(*member) == given)
        .ok_or_else(|| UnknownName {
            setting,
            given: given.to_string(),
            names: all.iter().map(|member| name(*member)).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_lists_the_names() {
        let error = find_by_name("size", "huge", &[1, 2, 3], |n| ["s", "m", "l"][n - 1]);
        assert_eq!(
            error.unwrap_err().to_string(),
            r#"unknown size "huge": use s, m or l"#
        );
        let error = find_by_name("side", "up", &[true], |_| "left").unwrap_err();
        assert_eq!(error.to_string(), r#"unknown side "up": use left"#);
    }
}
