mod cli;
mod config;
mod daemon;
mod store;
mod targets;
mod tools;
mod tools_prompt;
mod workspace;
