mod cli;
mod config;
mod daemon;
mod gpu;
mod gpu_kill;
mod gpu_routes;
mod store;
mod targets;
