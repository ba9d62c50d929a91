fn main() {
    std::process::exit(fk_agentd::cli::main());
}
