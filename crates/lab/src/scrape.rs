//! Reading a `/metrics` text back: the samples of the exposition (`cheetah_daemon::metrics`)
//! writes, for the testbed runners and the tests that sum counters across scrapes.
//!
//! Only what that exposition produces is handled: one sample per line as
//! `name{key="value",...} number` or `name number`, label values without escaped quotes.
//! Comment lines (`# TYPE`, `# HELP`, `# EOF`) are skipped.

/// One sample line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The sample's name (`cheetah_drops_total`, not the family's `cheetah_drops`).
    pub name: &'a str,
    /// What stands between the braces, empty when there are none.
    pub labels: &'a str,
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&'a str> {
        let labels = self.labels;
        let mut at = 0;
        while let Some(found) = labels[at..].find(key) {
            let start = at + found;
            let after = start + key.len();
            // A whole key: at the start or after a comma, followed by `="`.
            let whole = (start == 0 || labels.as_bytes()[start - 1] == b',')
                && labels[after..].starts_with("=\"");
            if whole {
                let value_start = after + 2;
                let len = labels[value_start..].find('"')?;
                return Some(&labels[value_start..value_start + len]);
            }
            at = after;
        }
        None
    }
}

/// Every sample of `text`, in order; lines that are not samples are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value = value.parse::<f64>().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            Some(Sample {
                name,
                labels,
                value,
            })
        })
}

/// The sum of every sample named `name`, over all its label sets.
pub fn total(text: &str, name: &str) -> f64 {
    samples(text)
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE cheetah_drops counter\n\
        cheetah_drops_total{worker=\"0\",reason=\"bad_ihl\"} 3\n\
        cheetah_drops_total{worker=\"1\",reason=\"bad_ihl\"} 4\n\
        cheetah_drops_totally{worker=\"0\"} 100\n\
        cheetah_io_tx_ring_full_total{worker=\"0\"} 2\n\
        cheetah_snapshot_generation 7\n\
        cheetah_server_packets_total{server=\"12\",subserver=\"9\"} 5\n\
        # EOF\n";

    #[test]
    fn a_total_sums_the_label_sets_of_exactly_that_name() {
        assert_eq!(total(TEXT, "cheetah_drops_total"), 7.0);
        assert_eq!(total(TEXT, "cheetah_io_tx_ring_full_total"), 2.0);
        assert_eq!(total(TEXT, "cheetah_snapshot_generation"), 7.0);
        assert_eq!(total(TEXT, "cheetah_missing_total"), 0.0);
    }

    #[test]
    fn samples_split_name_labels_and_value() {
        let all: Vec<Sample> = samples(TEXT).collect();
        assert_eq!(all.len(), 6, "comments skipped: {all:?}");
        assert_eq!(all[0].name, "cheetah_drops_total");
        assert_eq!(all[0].labels, "worker=\"0\",reason=\"bad_ihl\"");
        assert_eq!(all[0].label("reason"), Some("bad_ihl"));
        assert_eq!(all[0].label("worker"), Some("0"));
        assert_eq!(all[0].label("server"), None);
        assert_eq!(all[4].labels, "");
        // `server` is not found inside `subserver`, whichever comes first.
        assert_eq!(all[5].label("server"), Some("12"));
        let reversed = Sample {
            labels: "subserver=\"9\",server=\"12\"",
            ..all[5]
        };
        assert_eq!(reversed.label("server"), Some("12"));
    }
}
