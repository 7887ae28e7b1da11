//! Units: every process room code runs belongs to the participant it runs for.
//!
//! Each command and the terminal's program start under a keeper of their own: this binary
//! (`--exec-as`), running as the agent's user (root inside, so room code can neither signal
//! nor trace it), made a child subreaper, and parent of the unit's first process. A process
//! leaves its unit only by ending: whatever it does (`setsid`, `nohup`, a process group of its
//! own) its parent stays its parent, and an orphan (a double fork) is handed to the nearest
//! subreaper above it, which is its keeper (or a subreaper room code made, inside the unit).
//! So a process's unit is the keeper its parent chain reaches, and its participant is:
//!
//! - in a command's unit, the command's caller;
//! - in the terminal's unit, whoever ended the last line typed before its job started (a job
//!   is the process right below the terminal's program, or right below the keeper for an
//!   orphan); the terminal's program itself is the last line's typist's; before any line,
//!   [`TERMINAL`]'s.
//!
//! Stopping a participant's processes first stops (`SIGSTOP`) every one found, again until a
//! scan finds no new one (a stopped process forks no more, so its children are all found
//! with their parents), then kills them all.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;

/// Whom the terminal's processes count to before anyone has typed a line.
pub(super) const TERMINAL: &str = "terminal";
/// Changes of the terminal's typist remembered; older ones count to whoever came after.
const MAX_LINES: usize = 4096;
/// Scans while stopping, at most (each finds the processes forked since the last).
const MAX_ROUNDS: usize = 64;
/// A parent chain longer than this is not followed (pids are bounded; this bounds a loop).
const MAX_DEPTH: usize = 4096;

/// One unit: its keeper's pid, and whom it runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// A command run for this participant (empty: nobody in particular).
    Command(String),
    /// The shared terminal.
    Terminal,
}

/// Units by keeper pid.
static UNITS: Mutex<BTreeMap<i32, Kind>> = Mutex::new(BTreeMap::new());
/// Who ended the terminal's lines: (clock tick of the line's end, typist), one entry per
/// change of typist.
static LINES: Mutex<VecDeque<(u64, String)>> = Mutex::new(VecDeque::new());

fn units() -> std::sync::MutexGuard<'static, BTreeMap<i32, Kind>> {
    UNITS.lock().unwrap_or_else(|e| e.into_inner())
}

fn lines() -> std::sync::MutexGuard<'static, VecDeque<(u64, String)>> {
    LINES.lock().unwrap_or_else(|e| e.into_inner())
}

/// A unit's entry, removed when the unit is over.
pub(super) struct Unit(i32);

impl Unit {
    /// Registers the command unit kept by `keeper`, run for `actor`.
    pub(super) fn command(keeper: i32, actor: String) -> Unit {
        units().insert(keeper, Kind::Command(actor));
        Unit(keeper)
    }

    /// Registers the terminal's unit (kept by `keeper`), in place of any earlier one.
    pub(super) fn terminal(keeper: i32) -> Unit {
        let mut all = units();
        all.retain(|_, k| *k != Kind::Terminal);
        all.insert(keeper, Kind::Terminal);
        Unit(keeper)
    }

    /// The unit's keeper.
    pub(super) fn keeper(&self) -> i32 {
        self.0
    }
}

/// Ends every process below `keeper`.
pub(super) fn end_below(keeper: i32) {
    freeze_and_kill(|table, pid| table.chain(pid).skip(1).any(|p| p == keeper));
}

impl Drop for Unit {
    fn drop(&mut self) {
        units().remove(&self.0);
    }
}

/// Notes that `actor` ended a line in the terminal now (before its bytes reach the PTY).
pub(super) fn line_typed(actor: &str) {
    let now = now_ticks();
    let mut all = lines();
    if all.back().is_some_and(|(_, who)| who == actor) {
        return;
    }
    if all.len() >= MAX_LINES {
        all.pop_front();
    }
    all.push_back((now, actor.to_owned()));
}

/// Whether typed bytes end a line (Enter, Ctrl-J, Ctrl-O): the shell runs something.
pub(super) fn ends_line(data: &[u8]) -> bool {
    data.iter().any(|b| matches!(b, b'\r' | b'\n' | 0x0f))
}

/// Whom process `pid` runs for (empty when it is in no unit: the agent's own, or gone).
pub(super) fn owner_of(pid: i32) -> String {
    owner_in(&Table::read(), pid).0
}

/// Stops every process that runs for `actor`, the terminal's program aside (its jobs are
/// stopped, and the shell prompts again); returns how many.
pub(super) fn stop(actor: &str) -> usize {
    if actor.is_empty() {
        return 0;
    }
    freeze_and_kill(|table, pid| {
        let (owner, program) = owner_in(table, pid);
        owner == actor && !program
    })
}

/// Stops (then kills) every process `member` picks, and every process below one it picked,
/// scanning again until no new one appears.
fn freeze_and_kill(member: impl Fn(&Table, i32) -> bool) -> usize {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let mut stopped: HashSet<i32> = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let table = Table::read();
        let keepers: HashSet<i32> = units().keys().copied().collect();
        let new: Vec<i32> = table
            .procs
            .keys()
            .copied()
            .filter(|&p| p != me && !stopped.contains(&p) && !keepers.contains(&p))
            .filter(|&p| member(&table, p) || table.chain(p).any(|a| stopped.contains(&a)))
            .collect();
        if new.is_empty() {
            break;
        }
        for p in new {
            signal(p, libc::SIGSTOP);
            stopped.insert(p);
        }
    }
    for &p in &stopped {
        signal(p, libc::SIGKILL);
    }
    stopped.len()
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill with a plain pid and signal number.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Whom `pid` runs for, and whether it is the terminal's program.
fn owner_in(table: &Table, pid: i32) -> (String, bool) {
    let chain: Vec<i32> = table.chain(pid).collect();
    let all = units();
    let Some((at, kind)) = chain
        .iter()
        .enumerate()
        .find_map(|(i, p)| all.get(p).map(|k| (i, k.clone())))
    else {
        return (String::new(), false);
    };
    drop(all);
    match kind {
        Kind::Command(actor) => (actor, false),
        Kind::Terminal => {
            let keeper = chain[at];
            let program = table.first_child(keeper);
            // The process right below the keeper, and below the program when that is it.
            let below = |i: usize| i.checked_sub(1).map(|j| chain[j]);
            let job = match below(at) {
                Some(p) if Some(p) == program => below(at - 1),
                other => other,
            };
            match job.and_then(|j| table.procs.get(&j)) {
                Some(j) => (typist_at(j.start), false),
                // The keeper's program itself acts for the line it runs now.
                None => (typist_at(u64::MAX), at > 0),
            }
        }
    }
}

/// Who ended the last line typed at or before clock tick `tick`.
fn typist_at(tick: u64) -> String {
    lines()
        .iter()
        .rev()
        .find(|(t, _)| *t <= tick)
        .map_or_else(|| TERMINAL.to_owned(), |(_, who)| who.clone())
}

/// The clock processes' start times are counted in (`/proc/PID/stat`'s ticks since boot).
fn now_ticks() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid clock id and an out-pointer to a local.
    unsafe {
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts);
    }
    // SAFETY: sysconf with a constant name.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&h| h > 0)
        .unwrap_or(100);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * hz + nanos * hz / 1_000_000_000
}

/// One process as `/proc` shows it.
#[derive(Debug, Clone, Copy)]
struct Proc {
    parent: i32,
    start: u64,
}

/// Every process of the sandbox, read once.
struct Table {
    procs: HashMap<i32, Proc>,
}

impl Table {
    fn read() -> Table {
        let mut procs = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<i32>().ok())
                else {
                    continue;
                };
                if let Some(p) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| parse_stat(&s))
                {
                    procs.insert(pid, p);
                }
            }
        }
        Table { procs }
    }

    /// `pid`, its parent, its parent's parent, ... as far as the table knows them.
    fn chain(&self, pid: i32) -> impl Iterator<Item = i32> + '_ {
        let mut next = Some(pid);
        std::iter::from_fn(move || {
            let p = next?;
            next = self
                .procs
                .get(&p)
                .map(|x| x.parent)
                .filter(|&parent| parent > 0 && parent != p);
            Some(p)
        })
        .take(MAX_DEPTH)
    }

    /// The child of `pid` that started first (a keeper's program: orphans come later).
    fn first_child(&self, pid: i32) -> Option<i32> {
        self.procs
            .iter()
            .filter(|(_, p)| p.parent == pid)
            .min_by_key(|(child, p)| (p.start, **child))
            .map(|(child, _)| *child)
    }
}

/// The parent and start time in a `/proc/PID/stat` line (fields 4 and 22, counted after the
/// command's closing `)`, which may itself hold spaces and parentheses).
fn parse_stat(stat: &str) -> Option<Proc> {
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(Proc {
        parent: f.get(1)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis() {
        let line = "42 (a) b) (c) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 10";
        let p = parse_stat(line).unwrap();
        assert_eq!((p.parent, p.start), (7, 12345));
        assert!(parse_stat("42 (no close").is_none());
    }

    #[test]
    fn line_ends_are_enter_ctrl_j_and_ctrl_o() {
        assert!(ends_line(b"ls\r"));
        assert!(ends_line(b"ls\n"));
        assert!(ends_line(b"\x0f"));
        assert!(!ends_line(b"ls -l"));
    }
}
