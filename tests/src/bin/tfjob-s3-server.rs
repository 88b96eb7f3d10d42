//! `tfjob-s3-server [--port PORT] DIR [BUCKET...]`: the S3-compatible server of the tests
//! (s3s over s3s-fs) on 127.0.0.1, serving the directory DIR (each bucket a directory), to
//! try `--checkpoint_dir s3://...` and `examples/s3-checkpoints.yaml` without a cloud. It
//! prints the environment that points the runtime at it and serves until Ctrl-C.

use anyhow::{Context, Result, bail};
use tfjob_tests::s3::S3Server;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut port = 9000u16;
    let mut rest = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--port" => port = args.next().context("--port needs a number")?.parse().context("--port")?,
            "-h" | "--help" => {
                println!("usage: tfjob-s3-server [--port PORT (9000)] DIR [BUCKET...]");
                return Ok(());
            }
            _ => rest.push(a),
        }
    }
    let Some((dir, buckets)) = rest.split_first() else { bail!("usage: tfjob-s3-server [--port PORT] DIR [BUCKET...]") };
    let server = S3Server::serve(std::path::Path::new(dir), port)?;
    for b in buckets {
        server.create_bucket(b)?;
    }
    eprintln!("S3 server at {} serving {dir}; point the runtime at it with:", server.endpoint);
    for (k, v) in server.env() {
        println!("export {k}={v}");
    }
    // Until Ctrl-C or SIGTERM (their default action ends the process).
    loop {
        std::thread::park();
    }
}
