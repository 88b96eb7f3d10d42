//! Starts the test control plane (etcd, kube-apiserver, kube-controller-manager) for a person to
//! use, prints how to reach it, and stops it on Ctrl-C / SIGTERM / SIGHUP.
//!
//! Usage: controlplane [--dir DIR]
//!   --dir DIR   run in DIR (created, must be empty, kept afterwards); default: a temporary
//!               directory removed on exit.
//!
//! Normally started through tests/controlplane/up.sh.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use tfjob_tests::controlplane::{ControlPlane, Options};

fn usage() -> &'static str {
    "usage: controlplane [--dir DIR]\n\
     Starts etcd, kube-apiserver and kube-controller-manager on loopback ports, prints\n\
     `export KUBECONFIG=...`, and stops everything on Ctrl-C."
}

fn main() -> ExitCode {
    let mut options = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dir" => match args.next() {
                Some(d) => options.dir = Some(PathBuf::from(d)),
                None => {
                    eprintln!("--dir needs a value\n{}", usage());
                    return ExitCode::from(2);
                }
            },
            a if a.starts_with("--dir=") => options.dir = Some(PathBuf::from(&a["--dir=".len()..])),
            "-h" | "--help" => {
                println!("{}", usage());
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument `{other}`\n{}", usage());
                return ExitCode::from(2);
            }
        }
    }

    // Block the stop signals in every thread (threads inherit the mask; the harness gives the
    // components a clean mask) and take them synchronously in one thread. During startup a signal
    // exits at once: the kernel then kills the components (they run with PR_SET_PDEATHSIG).
    // SAFETY: plain libc signal-mask calls before any other thread exists.
    let signals = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    static READY: AtomicBool = AtomicBool::new(false);
    let (stop_tx, stop_rx) = mpsc::channel::<libc::c_int>();
    std::thread::spawn(move || {
        loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: waits for one of the blocked signals.
            if unsafe { libc::sigwait(&signals, &mut sig) } != 0 {
                continue;
            }
            if !READY.load(Ordering::SeqCst) {
                eprintln!("\nsignal {sig} during startup: exiting");
                std::process::exit(130);
            }
            let _ = stop_tx.send(sig);
        }
    });

    eprintln!("starting the control plane ...");
    let cp = match ControlPlane::start_with(options) {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::FAILURE;
        }
    };
    // From now on a signal stops the control plane cleanly (set before anything is printed, so
    // that whoever reacts to the output cannot race it).
    READY.store(true, Ordering::SeqCst);
    let v = cp.versions();
    eprintln!(
        "control plane ready: Kubernetes {} (etcd {}, helm {}) at {}\n\
         directory: {} (component logs in {}/logs)",
        v.kubernetes,
        v.etcd,
        v.helm,
        cp.server_url(),
        cp.dir().display(),
        cp.dir().display()
    );
    eprintln!("use it from another shell with:");
    // Not println!: a closed stdout must not stop the control plane.
    let _ = writeln!(std::io::stdout(), "export KUBECONFIG={}\nexport PATH={}:\"$PATH\"", cp.kubeconfig_path().display(), cp.bin_dir().display());
    eprintln!("press Ctrl-C to stop it");

    let sig = stop_rx.recv().unwrap_or(0);
    eprintln!("\nsignal {sig}: stopping the control plane ...");
    cp.stop();
    eprintln!("stopped");
    ExitCode::SUCCESS
}
