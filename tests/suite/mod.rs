mod cli;
mod config;
mod daemon;
mod store;
mod targets;
