//! The `anarchon` daemon (work in progress).

fn main() {
    eprintln!("anarchon: not built yet");
    std::process::exit(2);
}
