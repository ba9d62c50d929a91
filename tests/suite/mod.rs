mod cli;
mod config;
mod daemon;
mod score;
mod score_cli;
mod score_sim;
mod store;
mod targets;
