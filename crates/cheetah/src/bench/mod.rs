//! `cheetah bench`: to be written (trace generator first).
#![allow(dead_code)]

mod lab;
mod layouts;
mod rng;
mod trace;

#[derive(clap::Args)]
pub struct Args {}
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
