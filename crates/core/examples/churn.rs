//! Side by side: the same churn over the same connections in cheetah, plain-hash and
//! Maglev modes. Run with `cargo run --release -p cheetah-core --example churn [N]`.

use cheetah_core::config::Mode;
use cheetah_core::testkit::churn;

fn main() {
    let connections: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let reports: Vec<_> = [Mode::Cheetah, Mode::Hash, Mode::Maglev]
        .into_iter()
        .map(|m| churn::run(m, connections))
        .collect();
    println!(
        "{connections} open connections on 8 servers, two workers; between rounds of traffic:"
    );
    for change in &reports[0].changes {
        println!("  - {change}");
    }
    println!();
    println!(
        "{:<10} {:>14} {:>18} {:>20} {:>10}",
        "mode", "packets", "misrouted packets", "broken connections", "broken %"
    );
    for r in &reports {
        println!(
            "{:<10} {:>14} {:>18} {:>20} {:>9.2}%",
            r.mode.name(),
            r.packets,
            r.misrouted_packets,
            r.broken_connections,
            100.0 * r.broken_connections as f64 / r.connections as f64
        );
    }
}
