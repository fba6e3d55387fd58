//! `rgml chat` under a real pseudo-terminal: tmux runs it, `send-keys` types, `capture-pane`
//! reads the screen. A first turn answers as `rgml run --chat` does (greedy), a second turn
//! sees the first (its prompt holds the history, the cached part reused), `/reset` starts
//! over, Ctrl-C stops a reply and the chat goes on, `/exit` ends it.
//!
//! Needs `tmux` (Debian's; `scripts/test.sh` installs it and sets `RGML_REQUIRE_TMUX=1`, so CI
//! never skips); without it the test skips.

#[allow(dead_code)]
mod common;

use common::demo_model;
use std::process::Command;
use std::time::{Duration, Instant};

fn have_tmux() -> bool {
    let found = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var_os("RGML_REQUIRE_TMUX").is_some() {
        panic!("tmux is required (RGML_REQUIRE_TMUX is set)");
    }
    found
}

/// A tmux session running one command.
struct Pane {
    name: String,
}

impl Pane {
    fn start(name: &str, command: &str) -> Pane {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", name])
            .output();
        let status = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                "200",
                "-y",
                "60",
                command,
            ])
            .status()
            .expect("tmux");
        assert!(status.success());
        Pane { name: name.into() }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-J", "-S", "-500", "-t", &self.name])
            .output()
            .expect("capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until `pred` holds of the screen; panics with the screen after 60 s.
    fn wait(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "waiting for {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn keys(&self, keys: &[&str]) {
        let status = Command::new("tmux")
            .args(["send-keys", "-t", &self.name])
            .args(keys)
            .status()
            .expect("send-keys");
        assert!(status.success());
    }

    fn type_line(&self, text: &str) {
        self.keys(&["-l", text]);
        self.keys(&["Enter"]);
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .output();
    }
}

/// `rgml chat` with `args`, then a marker with its exit status, in a shell that stays.
fn chat_command(args: &str) -> String {
    format!(
        "{} chat -m {} -t 2 -fa off {args} 2>&1; echo CHAT-EXITED-$?; sleep 600",
        env!("CARGO_BIN_EXE_rgml"),
        demo_model().display()
    )
}

fn count(screen: &str, what: &str) -> usize {
    screen.matches(what).count()
}

/// The prompt sizes of the `[prompt: N tokens, R reused, ...]` lines.
fn prompt_stats(screen: &str) -> Vec<(usize, usize)> {
    screen
        .lines()
        .filter_map(|l| l.strip_prefix("[prompt: "))
        .filter_map(|l| {
            let mut words = l.split([' ', ',']).filter(|w| !w.is_empty());
            let n = words.next()?.parse().ok()?;
            let reused = words.nth(1)?.parse().ok()?;
            Some((n, reused))
        })
        .collect()
}

#[test]
fn a_conversation_in_a_terminal() {
    if !have_tmux() {
        return;
    }
    let question = "What is the capital of France?";
    let run = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(["run", "-m"])
        .arg(demo_model())
        .args([
            "-t", "2", "-fa", "off", "--chat", "--temp", "0", "-n", "24", "-p", question,
        ])
        .output()
        .expect("rgml run");
    let expected = String::from_utf8(run.stdout).unwrap().trim().to_string();
    assert!(!expected.is_empty());

    let pane = Pane::start("rgml-chat-test", &chat_command("--temp 0 -n 24"));
    pane.wait("the prompt", |s| s.contains("> "));
    pane.type_line(question);
    let screen = pane.wait("the first reply", |s| count(s, "[prompt: ") == 1);
    assert!(
        screen.contains(&expected),
        "expected {expected:?} in:\n{screen}"
    );
    pane.type_line("And of Germany?");
    let screen = pane.wait("the second reply", |s| count(s, "[prompt: ") == 2);
    let stats = prompt_stats(&screen);
    assert_eq!(stats.len(), 2, "{screen}");
    // The second prompt holds the first turn, which the session still has.
    assert!(
        stats[1].0 > stats[0].0 + 4 && stats[1].1 > stats[0].0,
        "{stats:?}\n{screen}"
    );
    pane.type_line("/reset");
    pane.wait("the reset", |s| s.contains("(conversation cleared)"));
    pane.type_line(question);
    let screen = pane.wait("the third reply", |s| count(s, "[prompt: ") == 3);
    assert_eq!(prompt_stats(&screen)[2], (stats[0].0, 0), "{screen}");
    assert_eq!(
        count(&screen, &expected),
        2,
        "the same answer after /reset:\n{screen}"
    );
    pane.type_line("/exit");
    pane.wait("the end", |s| s.contains("CHAT-EXITED-0"));
}

/// The words of the reply after the last line typed (`typed`).
fn reply_after<'a>(screen: &'a str, typed: &str) -> &'a str {
    screen.rsplit(typed).next().unwrap_or_default()
}

#[test]
fn ctrl_c_stops_a_reply_and_the_chat_goes_on() {
    if !have_tmux() {
        return;
    }
    // Sampled, the end-of-turn token (2) banned: replies long enough to stop.
    let pane = Pane::start(
        "rgml-chat-ctrl-c",
        &chat_command("--temp 1 --seed 3 -l 2-inf"),
    );
    pane.wait("the prompt", |s| s.contains("> "));
    for (i, line) in [
        "Write a very long story about a dragon.",
        "Another one, please.",
    ]
    .into_iter()
    .enumerate()
    {
        pane.type_line(line);
        // Some of the reply is on the screen: it streams.
        pane.wait("the reply to stream", |s| {
            reply_after(s, line).trim().len() > 40
        });
        pane.keys(&["C-c"]);
        let screen = pane.wait("the stop", |s| count(s, "(stopped)") == i + 1);
        assert_eq!(count(&screen, "[prompt: "), i + 1, "{screen}");
        assert!(
            !screen.contains("CHAT-EXITED"),
            "the chat goes on:\n{screen}"
        );
    }
    let screen = pane.screen();
    let stats = prompt_stats(&screen);
    assert!(
        stats[1].1 > 0,
        "the stopped reply stays in the history: {stats:?}"
    );
    // End of input ends it.
    pane.keys(&["C-d"]);
    pane.wait("the end", |s| s.contains("CHAT-EXITED-0"));
}
