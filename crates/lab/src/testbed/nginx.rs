//! The servers: one Debian nginx master per server namespace, with the echo module for
//! `/slow`.

use std::fmt::Write as _;
use std::io::{BufWriter, Write as _};
use std::path::Path;

use anyhow::{bail, Context};

use super::netns;
use super::plan::Server;
use super::shell::Cmd;

/// Where Debian's `libnginx-mod-http-echo` puts the module.
pub const ECHO_MODULE: &str = "/usr/lib/nginx/modules/ngx_http_echo_module.so";
pub const SMALL_BYTES: usize = 1024;
/// Long enough that a transfer outlives server changes in the end-to-end tests.
pub const LARGE_BYTES: usize = 32 << 20;
/// What `/slow` waits without `?ms=`.
pub const SLOW_DEFAULT_SECS: u32 = 2;
/// How long nginx keeps an idle keep-alive connection: longer than the longest idle gap a
/// live test waits between two requests (520 s, just under the cookie layout's limit), so
/// that nginx's own timeout never ends a connection the tests watch.
pub const KEEPALIVE_TIMEOUT_SECS: u32 = 600;
/// The path served with nginx's default `keepalive_timeout` (75 s), where nginx closes an
/// idle connection itself: a test checks that the client sees that FIN.
pub const DEFAULT_KEEPALIVE_PATH: &str = "/keepalive-75s";
/// nginx's own default `keepalive_timeout`.
pub const DEFAULT_KEEPALIVE_TIMEOUT_SECS: u32 = 75;

pub fn require_echo_module() -> anyhow::Result<()> {
    if !Path::new(ECHO_MODULE).exists() {
        bail!("{ECHO_MODULE} is missing (Debian package libnginx-mod-http-echo; scripts/setup.sh installs it)");
    }
    Ok(())
}

/// The files every server serves. `/large` counts up in 8-byte big-endian words, so a
/// client can check any byte range of it without a copy of the file.
pub fn write_content(www: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(www).with_context(|| format!("cannot create {}", www.display()))?;
    let line = b"cheetah testbed: a small object for short requests\n";
    let small: Vec<u8> = line.iter().copied().cycle().take(SMALL_BYTES).collect();
    let small_path = www.join("small");
    std::fs::write(&small_path, small)
        .with_context(|| format!("cannot write {}", small_path.display()))?;

    let large_path = www.join("large");
    let file = std::fs::File::create(&large_path)
        .with_context(|| format!("cannot create {}", large_path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    for word in 0..(LARGE_BYTES / 8) as u64 {
        out.write_all(&word.to_be_bytes())?;
    }
    out.flush()
        .with_context(|| format!("cannot write {}", large_path.display()))?;
    Ok(())
}

/// nginx reads paths with spaces only when quoted.
fn quoted(path: &Path) -> String {
    let text = path.to_string_lossy();
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Open files a worker may have: as many as allowed up to 65536. nginx cannot raise the
/// hard limit it inherits (it keeps no CAP_SYS_RESOURCE where it runs in a container).
pub fn file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    if known {
        limit.rlim_max.min(65_536)
    } else {
        1024
    }
}

/// `file_limit`: see [`file_limit`]; a connection sending a file holds two descriptors.
pub fn config_text(server: &Server, www: &Path, file_limit: u64) -> String {
    let name = &server.name;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Written by `cheetah testbed up` for server {name} ({}).",
        server.namespace
    );
    let _ = writeln!(text, "load_module {ECHO_MODULE};");
    let _ = writeln!(
        text,
        "# Workers run as root so that they can read a --dir only root may enter."
    );
    let _ = writeln!(text, "user root;");
    let _ = writeln!(text, "worker_processes 1;");
    let _ = writeln!(text, "worker_rlimit_nofile {file_limit};");
    let _ = writeln!(text, "pid {};", quoted(&server.nginx_pid_file));
    let _ = writeln!(text, "error_log {} warn;", quoted(&server.error_log));
    let _ = writeln!(text, "events {{ worker_connections {}; }}", file_limit / 2);
    let _ = writeln!(text, "http {{");
    let _ = writeln!(text, "    access_log off;");
    let _ = writeln!(text, "    default_type application/octet-stream;");
    let _ = writeln!(text, "    sendfile on;");
    let _ = writeln!(text, "    keepalive_timeout {KEEPALIVE_TIMEOUT_SECS}s;");
    let _ = writeln!(text, "    keepalive_requests 1000000;");
    let _ = writeln!(
        text,
        "    client_body_temp_path {};",
        quoted(&server.dir.join("body"))
    );
    let _ = writeln!(
        text,
        "    # /slow?ms=N waits N milliseconds; echo_sleep takes seconds, so insert the point."
    );
    let _ = writeln!(text, "    map $arg_ms $slow_seconds {{");
    let _ = writeln!(text, "        default {SLOW_DEFAULT_SECS};");
    let _ = writeln!(
        text,
        r"        ~^(?<whole>\d+)(?<milli>\d\d\d)$ $whole.$milli;"
    );
    let _ = writeln!(text, r"        ~^(?<milli>\d\d\d)$ 0.$milli;");
    let _ = writeln!(text, r"        ~^(?<milli>\d\d)$ 0.0$milli;");
    let _ = writeln!(text, r"        ~^(?<milli>\d)$ 0.00$milli;");
    let _ = writeln!(text, "    }}");
    let _ = writeln!(text, "    server {{");
    // Every address: the VIP is on lo in l2 forwarding, NAT sends to the DIP. No
    // `so_keepalive`: like nginx's default, the servers send no TCP keepalive probes, so
    // an idle connection carries no packet at all (what the idle tests need).
    let _ = writeln!(text, "        listen 80 reuseport;");
    let _ = writeln!(text, "        root {};", quoted(www));
    let _ = writeln!(
        text,
        "        # `always`: errors too, so that even a 404 tells which server answered."
    );
    let _ = writeln!(text, "        add_header X-Server {name} always;");
    let _ = writeln!(
        text,
        "        location = / {{ default_type text/plain; return 200 \"{name}\\n\"; }}"
    );
    let _ = writeln!(text, "        location = /small {{ }}");
    let _ = writeln!(text, "        location = /large {{ }}");
    let _ = writeln!(
        text,
        "        location = /slow {{ default_type text/plain; echo_sleep $slow_seconds; echo \"{name} waited $slow_seconds s\"; }}"
    );
    let _ = writeln!(
        text,
        "        location = {DEFAULT_KEEPALIVE_PATH} {{ keepalive_timeout {DEFAULT_KEEPALIVE_TIMEOUT_SECS}s; default_type text/plain; return 200 \"{name}\\n\"; }}"
    );
    let _ = writeln!(text, "    }}");
    let _ = writeln!(text, "}}");
    text
}

/// Writes the server's config and starts its nginx master (which daemonizes once it
/// listens), then checks that it answers.
pub fn start(server: &Server, www: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(&server.dir)
        .with_context(|| format!("cannot create {}", server.dir.display()))?;
    std::fs::write(&server.nginx_conf, config_text(server, www, file_limit()))
        .with_context(|| format!("cannot write {}", server.nginx_conf.display()))?;
    // `-e`: before reading its config nginx opens the compiled-in error log, which in a
    // fresh namespace (or without /var/log/nginx) is the wrong place or not there.
    Cmd::in_netns(&server.namespace, "nginx")
        .arg("-c")
        .arg(&server.nginx_conf)
        .arg("-e")
        .arg(&server.error_log)
        .run()
        .with_context(|| {
            format!(
                "nginx of {} did not start (see {})",
                server.name,
                server.error_log.display()
            )
        })?;
    Cmd::in_netns(&server.namespace, "curl")
        .args([
            "-sf",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "http://127.0.0.1/",
        ])
        .run()
        .with_context(|| format!("nginx of {} does not answer on port 80", server.name))?;
    Ok(())
}

/// Pids of the nginx processes (master and worker) in the namespace.
pub fn pids(namespace: &str) -> anyhow::Result<Vec<i32>> {
    Ok(netns::pids(namespace)?
        .into_iter()
        .filter(|&pid| netns::process_name(pid).as_deref() == Some("nginx"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::plan::Topology;
    use crate::testbed::Options;

    #[test]
    fn every_response_names_its_server_and_slow_waits() {
        let topo = Topology::plan(&Options {
            servers: 2,
            dir: Some("/srv/test bed".into()),
            ..Options::default()
        })
        .unwrap();
        let s2 = topo.server(2).unwrap();
        let text = config_text(s2, &topo.files.www, 20_000);
        assert!(text.contains("add_header X-Server s2 always;"));
        assert!(text.contains("listen 80 reuseport;"));
        assert!(!text.contains("so_keepalive"));
        assert!(text.contains("    keepalive_timeout 600s;"));
        assert!(text.contains(
            "location = /keepalive-75s { keepalive_timeout 75s; default_type text/plain; return 200 \"s2\\n\"; }"
        ));
        assert!(text.contains("worker_rlimit_nofile 20000;"));
        assert!(text.contains("worker_connections 10000;"));
        assert!(text.contains("keepalive_requests 1000000;"));
        assert!(text.contains("root \"/srv/test bed/www\";"));
        assert!(text.contains("pid \"/srv/test bed/s2/nginx.pid\";"));
        assert!(text.contains("echo_sleep $slow_seconds;"));
        assert!(text.contains(&format!("default {SLOW_DEFAULT_SECS};")));
        assert!(text.contains(r"~^(?<whole>\d+)(?<milli>\d\d\d)$ $whole.$milli;"));
    }

    #[test]
    fn large_counts_up_in_words() {
        let dir = tempfile::tempdir().unwrap();
        write_content(dir.path()).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("small")).unwrap().len(),
            SMALL_BYTES
        );
        let large = std::fs::read(dir.path().join("large")).unwrap();
        assert_eq!(large.len(), LARGE_BYTES);
        let last = LARGE_BYTES - 8;
        assert_eq!(large[last..], ((last / 8) as u64).to_be_bytes());
    }
}
