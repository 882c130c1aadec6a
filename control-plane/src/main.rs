//! `lap-server`: parse settings, validate them all, then serve. Exit 2 on bad configuration.

use std::process::ExitCode;

use clap::Parser;
use lap_control_plane::settings::Settings;
use lap_control_plane::{api, reconciler, server};

#[tokio::main]
async fn main() -> ExitCode {
    let filter = std::env::var("LAP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .json()
        .init();

    let settings = Settings::parse();
    let srv = match server::build(&settings).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lap-server: {e}");
            return ExitCode::from(2);
        }
    };
    if srv.keys.created_master_key {
        println!(
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
    tracing::info!(listen = %settings.listen, "lap-server listening");
    println!("lap-server listening on http://{}", settings.listen);
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Err(e) = axum::serve(listener, api::router(srv.app))
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("lap-server: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
