//! `cheetah bench`: to be written.
#[derive(clap::Args)]
pub struct Args {}
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
