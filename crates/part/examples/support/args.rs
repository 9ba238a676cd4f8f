//! The `[KEYS] [ROUNDS]` arguments of the timing examples (`push_down`,
//! `watch_cost`): 1000 keys and 300 rounds unless given; anything but a
//! positive number is refused with the usage line.

/// (keys, rounds) from the command line; exits 2 on a bad argument.
pub fn keys_and_rounds(usage: &str) -> (usize, usize) {
    let mut nums = Vec::new();
    for a in std::env::args().skip(1) {
        match a.parse::<usize>() {
            Ok(n) if n > 0 && nums.len() < 2 => nums.push(n),
            _ => {
                eprintln!("bad argument {a:?}; usage: {usage}");
                std::process::exit(2);
            }
        }
    }
    (
        nums.first().copied().unwrap_or(1000),
        nums.get(1).copied().unwrap_or(300),
    )
}
