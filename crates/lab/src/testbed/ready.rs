//! Waiting until an LB instance is ready to take traffic: its `GET /ready` answers 200
//! (it knows the clock and the health of every active server, issue 21). The API listens
//! inside the instance's namespace, so the request is made from there.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::plan::Lb;

/// Between two asks.
const POLL: Duration = Duration::from_millis(200);

/// What one `GET /ready` got.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ready,
    /// 503: the body names what the instance waits for.
    NotYet(String),
    /// No answer at all: the LB is not (yet) listening.
    Silent,
    /// Anything else: waiting would not help (404: a `cheetah run` without readiness).
    Unexpected(u16, String),
}

/// Waits until instance `lb`'s API at `api` (as reachable inside its namespace) says it is
/// ready; fails after `timeout` naming what it still waited for.
pub fn wait(lb: &Lb, api: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let answer = ask(lb, api)?;
        match &answer {
            Answer::Ready => return Ok(()),
            Answer::Unexpected(code, body) => bail!(
                "LB instance {} ({}): GET http://{api}/ready answered {code}, not 200 or 503{}: {}",
                lb.instance,
                lb.namespace,
                if *code == 404 {
                    " (this `cheetah run` has no readiness endpoint)"
                } else {
                    ""
                },
                body.trim()
            ),
            Answer::NotYet(_) | Answer::Silent => {}
        }
        if Instant::now() >= deadline {
            let why = match answer {
                Answer::NotYet(body) => format!("GET /ready still answers 503: {}", body.trim()),
                _ => format!(
                    "nothing answers at http://{api}/ready (is `cheetah run` running there?)"
                ),
            };
            bail!(
                "LB instance {} ({}) is not ready after {timeout:?}: {why}",
                lb.instance,
                lb.namespace
            );
        }
        std::thread::sleep(POLL);
    }
}

fn ask(lb: &Lb, api: &str) -> anyhow::Result<Answer> {
    let url = format!("http://{api}/ready");
    // `-w` puts the status on a line of its own after the body; curl prints 000 (and exits
    // non-zero) when it could not connect, which is an answer here, not a failure.
    let out = Command::new("ip")
        .args(["netns", "exec", &lb.namespace, "curl", "-s", "-m", "2"])
        .args(["-w", "\n%{http_code}", &url])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run curl in {}", lb.namespace))?;
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

fn parse(stdout: &str) -> Answer {
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", stdout));
    match code.trim().parse::<u16>() {
        Ok(200) => Answer::Ready,
        Ok(503) => Answer::NotYet(body.to_string()),
        Ok(0) | Err(_) => Answer::Silent,
        Ok(code) => Answer::Unexpected(code, body.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_200_is_ready_and_only_503_or_silence_is_worth_waiting_for() {
        assert_eq!(parse("{\"ready\":true}\n200"), Answer::Ready);
        assert_eq!(
            parse("{\"ready\":false,\"waiting\":[\"s1\"]}\n503"),
            Answer::NotYet("{\"ready\":false,\"waiting\":[\"s1\"]}".into())
        );
        assert_eq!(parse("\n000"), Answer::Silent);
        assert_eq!(parse(""), Answer::Silent);
        assert_eq!(
            parse("not found\n404"),
            Answer::Unexpected(404, "not found".into())
        );
    }
}
