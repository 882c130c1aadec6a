//! `lap-server`: parse settings, validate them all, then serve. Exit 2 on bad configuration.

use std::process::ExitCode;

use clap::Parser;
use lap_control_plane::settings::Settings;
use lap_control_plane::{api, console, reconciler, server};

#[tokio::main]
async fn main() -> ExitCode {
    // Everything the server creates (database, keys, sandboxes' files) is its own only.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let filter = std::env::var("LAP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .init();

    let settings = Settings::parse();
    let srv = match server::build(&settings).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lap-server: {e}");
            return ExitCode::from(2);
        }
    };
    // Shown once, on stderr: never in the JSON log stream (stdout), which is collected.
    if srv.keys.created_master_key {
        eprintln!(
            "Created a master key (kept in {}/master_key, shown only now):\n\n    MASTER_KEY={}\n",
            settings.data_dir.display(),
            srv.keys.master_key
        );
    }
    let listener = match tokio::net::TcpListener::bind(settings.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("lap-server: cannot listen on {} (LAP_LISTEN): {e}", settings.listen);
            return ExitCode::from(2);
        }
    };
    tokio::spawn(reconciler::run(srv.app.clone(), settings.reconcile_interval));
    // The address bound: with port 0 (LAP_LISTEN=127.0.0.1:0) the one the kernel chose.
    let bound = listener.local_addr().unwrap_or(settings.listen);
    tracing::info!(listen = %bound, "lap-server listening");
    eprintln!("lap-server listening on http://{bound}");
    // Ctrl-C / SIGTERM: stop accepting, let requests finish, but never wait more than 5 s on
    // long-lived streams (SSE). Sandboxes keep running; the next start adopts them.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let signal = wait_for_signal().await;
        tracing::info!(
            signal,
            "shutting down: no new requests; sandboxes keep running and the next start adopts them"
        );
        let _ = stop_tx.send(true);
    });
    let mut graceful = stop_rx.clone();
    let router =
        api::router(srv.app.clone()).merge(console::router(srv.app, console::Platform::from_settings(&settings)));
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        let _ = graceful.wait_for(|stop| *stop).await;
    });
    let mut deadline = stop_rx;
    let hard_stop = async move {
        let _ = deadline.wait_for(|stop| *stop).await;
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    };
    tokio::select! {
        result = server => {
            if let Err(e) = result {
                eprintln!("lap-server: {e}");
                return ExitCode::FAILURE;
            }
        }
        () = hard_stop => tracing::info!("open streams did not close within 5s; exiting"),
    }
    tracing::info!("lap-server stopped");
    ExitCode::SUCCESS
}

/// SIGINT (Ctrl-C) or SIGTERM; which one.
async fn wait_for_signal() -> &'static str {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        () = term => "SIGTERM",
    }
}
