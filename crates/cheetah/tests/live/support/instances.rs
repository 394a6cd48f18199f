//! Several LB instances of one testbed (`cheetah testbed up --lbs N`): `cheetah run` in
//! each with the one config and key, and the router's ECMP pool, which an instance joins
//! only once ready (`cheetah testbed lb join`) and leaves with `cheetah testbed lb leave`.

use std::path::{Path, PathBuf};

use super::{cheetah_ok, Lb, Testbed};

pub struct Instances {
    prefix: String,
    /// Instance k is `lbs[k - 1]`.
    pub lbs: Vec<Lb>,
}

impl Instances {
    /// Starts `cheetah run --config CONFIG` in every LB instance of `testbed`, the second
    /// on with `--state-dir` (its own state folder); waits for each data path. The router's
    /// pool is still empty.
    pub fn start(testbed: &Testbed, config: &Path) -> Self {
        let summary = &testbed.summary;
        let more = summary["more_lbs"].as_array().cloned().unwrap_or_default();
        let mut lbs = vec![Lb::start(testbed, config)];
        for lb in &more {
            let k = lb["instance"].as_u64().expect("an instance number");
            let state_dir = PathBuf::from(lb["state_dir"].as_str().expect("a state_dir"));
            let namespace = lb["namespace"].as_str().expect("a namespace");
            let log = testbed.dir.join(format!("lb{k}.log"));
            let state_arg = state_dir.to_string_lossy().into_owned();
            lbs.push(Lb::start_in(
                namespace,
                config,
                &["--state-dir", &state_arg],
                log,
            ));
        }
        Instances {
            prefix: testbed.prefix.clone(),
            lbs,
        }
    }

    /// Instance `k` (1-based).
    pub fn lb(&self, k: usize) -> &Lb {
        &self.lbs[k - 1]
    }

    /// Adds instance `k` to the router's pool once its `GET /ready` answers 200.
    pub fn join(&self, k: usize) {
        cheetah_ok(&[
            "testbed",
            "lb",
            "join",
            "--prefix",
            &self.prefix,
            "--lb",
            &k.to_string(),
        ]);
    }

    /// Joins every instance, one after the other.
    pub fn join_all(&self) {
        for k in 1..=self.lbs.len() {
            self.join(k);
        }
    }

    /// Takes instance `k` out of the router's pool.
    pub fn leave(&self, k: usize) {
        cheetah_ok(&[
            "testbed",
            "lb",
            "leave",
            "--prefix",
            &self.prefix,
            "--lb",
            &k.to_string(),
        ]);
    }

    /// `cheetah ctl ARGS` on every instance.
    pub fn ctl_all(&self, args: &[&str]) {
        for lb in &self.lbs {
            lb.ctl_ok(args);
        }
    }

    /// How often each instance counted `event`, instance 1 first.
    pub fn event_counts(&self, event: &str) -> Vec<f64> {
        self.lbs.iter().map(|lb| lb.event_count(event)).collect()
    }
}
