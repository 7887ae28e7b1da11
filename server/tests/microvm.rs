//! The microVM tier against the real VMMs: a room's sandbox as a QEMU guest (software
//! emulation, which runs everywhere), and the cloud-hypervisor driver against its real binary.
//!
//! The guest image comes from `CODEROOM_TEST_IMAGE_DIR` (`tests/run` builds it with
//! `coderoom image build`); without it, or without QEMU, the tests report themselves skipped.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The built image's directory and its kernel release, or `None` after reporting the skip.
fn guest_image() -> Option<(PathBuf, String)> {
    let Some(dir) = std::env::var_os("CODEROOM_TEST_IMAGE_DIR").map(PathBuf::from) else {
        skip(
            Need::Qemu,
            "CODEROOM_TEST_IMAGE_DIR is not set (no guest image)",
        );
        return None;
    };
    let Ok(hash) = std::fs::read_to_string(dir.join("current")) else {
        skip(Need::Qemu, "no image built in CODEROOM_TEST_IMAGE_DIR");
        return None;
    };
    if which("qemu-system-x86_64").is_none() {
        skip(Need::Qemu, "qemu-system-x86_64 is not installed");
        return None;
    }
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join(hash.trim()).join("manifest.json")).expect("manifest"),
    )
    .expect("manifest json");
    let release = manifest["kernel_release"]
        .as_str()
        .expect("release")
        .to_owned();
    Some((dir, release))
}

fn which(name: &str) -> Option<PathBuf> {
    coderoom_sandbox::vm::find_program(None, name)
}

/// Server flags for a QEMU room (software emulation: no probe, works on any host).
fn qemu_flags(image: &Path) -> Vec<String> {
    [
        "--sandbox-tier",
        "microvm",
        "--vmm",
        "qemu",
        "--vm-accel",
        "tcg",
        "--sandbox-memory-mb",
        "256",
        "--sandbox-workspace-mb",
        "128",
        "--admin-emails",
        "root@example.com",
        "--image-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([image.display().to_string()])
    .collect()
}

/// Runs `script` in the room's VM until it succeeds (the first call boots the guest, which
/// under software emulation on a busy machine takes a while); its answer.
async fn vm_exec(server: &Server, token: &str, room: &str, script: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let (status, out) = exec(server, token, room, script).await;
        if status == 200 {
            return out;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "exec {script:?} kept failing: {status} {out}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The pid of the VMM running `room`'s VM, whichever VMM it is: QEMU's `-name` says whose it
/// is; cloud-hypervisor is named by nothing on its command line (`--api-socket fd=N`) but holds
/// its disk open, under the VM's directory (`<state dir>/<room>-<server pid>-<n>/`).
fn vmm_pid(room: &str) -> Option<i32> {
    let qemu = format!("coderoom-{room},process=coderoom-vm");
    let vm_dir = format!("/{room}-");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.contains(&qemu.as_bytes()) {
            return Some(pid);
        }
        if !args.first()?.ends_with(b"cloud-hypervisor") {
            return None;
        }
        let holds_its_disk = std::fs::read_dir(e.path().join("fd"))
            .ok()?
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.to_string_lossy().contains(&vm_dir))
            });
        holds_its_disk.then_some(pid)
    })
}

/// The memory cgroup directory of `pid` (v1 or v2) and the files of its limit and peak.
fn memory_cgroup(pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let read =
            |p: PathBuf| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
        if controllers.split(',').any(|c| c == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            return Some((
                read(dir.join("memory.limit_in_bytes"))?,
                read(dir.join("memory.max_usage_in_bytes"))?,
            ));
        }
        if controllers.is_empty() {
            let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            if let (Some(max), Some(peak)) =
                (read(dir.join("memory.max")), read(dir.join("memory.peak")))
            {
                return Some((max, peak));
            }
        }
    }
    None
}

/// One room on the QEMU tier, end to end: the terminal reaches a shell inside the guest (its
/// kernel, not the host's), exec and files work, the editor and the VM's disk stay in step,
/// the guest sees no host file and no network but loopback, a memory hog dies inside the guest
/// while the VMM stays under its cgroup limit, the workspace survives a stop and a server
/// restart, `kill -9` of the VMM is told and restarts from the last snapshot, and deleting the
/// room leaves no disk, no snapshot.
#[tokio::test]
async fn a_room_runs_in_a_qemu_microvm() {
    let Some((image, release)) = guest_image() else {
        return;
    };
    let storage = Storage::new(&Backend::Sqlite).await;
    let root = storage.token("root@example.com").await;
    let flags = qemu_flags(&image);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let t = team_with(&storage, &flags).await;
    let (server, room) = (&t.server, &t.room);

    // Exec reaches the guest: its kernel, its disk.
    let out = vm_exec(
        server,
        &t.ben,
        room,
        "uname -r; grep ' /workspace ' /proc/mounts",
    )
    .await;
    let stdout = out["stdout"].as_str().unwrap();
    assert!(stdout.starts_with(&format!("{release}\n")), "{out}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(
        host.trim() != release || !stdout.contains("vda"),
        "the guest runs its own kernel"
    );
    assert!(stdout.contains("/dev/vda /workspace ext4"), "{out}");
    let status = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await;
    assert_eq!(status["tier"], "microvm", "{status}");
    assert_eq!(status["receipt"]["vm"]["vmm"], "qemu", "{status}");
    assert_eq!(status["receipt"]["vm"]["accel"], "tcg", "{status}");
    assert_eq!(
        status["receipt"]["vm"]["guest_kernel"],
        release.as_str(),
        "{status}"
    );
    let hash = std::fs::read_to_string(image.join("current")).unwrap();
    assert_eq!(status["receipt"]["vm"]["image"], hash.trim(), "{status}");

    // Isolation: no host file, no network interface but loopback.
    let marker = format!("coderoom-host-marker-{}", std::process::id());
    std::fs::write(std::env::temp_dir().join(&marker), "host").unwrap();
    let out = vm_exec(
        server,
        &t.ben,
        room,
        &format!(
            "ls /sys/class/net; ls /tmp; test -e /etc/debian_version && echo HOST-ETC; \
             test -e /tmp/{marker} && echo HOST-TMP; ls / | tr '\\n' ' '"
        ),
    )
    .await;
    let stdout = out["stdout"].as_str().unwrap().to_owned();
    assert_eq!(stdout.lines().next(), Some("lo"), "{out}");
    assert!(!stdout.contains("HOST-"), "{out}");
    assert!(!stdout.contains(&marker), "{out}");
    assert!(
        !stdout.contains("home "),
        "the host's root is not there: {out}"
    );

    // The image's userland: Python 3, git and a C compiler, read-only at /usr.
    let out = vm_exec(
        server,
        &t.ben,
        room,
        "python3 -c 'print(6 * 7)'; git init -q /tmp/repo && git -C /tmp/repo status --porcelain && echo git-ok; \
         touch /usr/bin/x 2>/dev/null || echo usr-read-only; \
         printf '#include <stdio.h>\\nint main(void) { printf(\"cc-%%d\\\\n\", 6 * 7); return 0; }\\n' > /tmp/c.c && \
         gcc -O1 -o /tmp/c /tmp/c.c && /tmp/c",
    )
    .await;
    assert_eq!(out["stdout"], "42\ngit-ok\nusr-read-only\ncc-42\n", "{out}");

    // The shared terminal is a shell inside the VM.
    let mut typer = term(server, room, &t.ben).await;
    typer.send(b"uname -r; echo typed-$((6*7))\n").await;
    typer.output_contains("typed-42").await;
    assert!(typer.output.contains(&release), "{}", typer.output);

    // The editor's file lands on the VM's disk; a file written in the VM reaches the editor.
    let mut editor = Client::connect(server, room, &t.ben).await;
    editor.synced().await;
    editor
        .put_file("notes.txt", "written in the editor\n")
        .await;
    let seen = stdout_until(
        server,
        &t.ben,
        room,
        "cat /workspace/notes.txt",
        "written in the editor",
    )
    .await;
    assert_eq!(seen, "written in the editor\n");
    // A binary file of several snapshot chunks: restoring it crosses the virtio port in many
    // frames (a short read on the port must not stall the agent).
    let out = vm_exec(
        server,
        &t.ben,
        room,
        "echo made-in-the-vm > /workspace/vm.txt; head -c 3000000 /dev/urandom > /workspace/big.bin; \
         md5sum < /workspace/big.bin; sync",
    )
    .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    let big_sum = out["stdout"].as_str().unwrap().to_owned();
    editor.wait_for_file("vm.txt", "made-in-the-vm\n").await;

    // A memory hog is stopped inside the guest; the VMM stays alive under its limit.
    let pid = vmm_pid(room).expect("the VMM process");
    let out = vm_exec(
        server,
        &t.ben,
        room,
        "awk 'BEGIN { s = \"0123456789abcdef\"; while (1) s = s s }'; echo hog-exit=$?",
    )
    .await;
    let stdout = out["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("hog-exit=137"),
        "killed by the guest's OOM killer: {out}"
    );
    assert_eq!(vmm_pid(room), Some(pid), "the same VMM process runs on");
    let out = vm_exec(server, &t.ben, room, "echo still-here").await;
    assert_eq!(out["stdout"], "still-here\n");
    let as_root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let cgroup = memory_cgroup(pid);
    assert!(
        cgroup.is_some() || !as_root,
        "a server running as root puts each VMM in a memory cgroup"
    );
    // The VMM runs under a uid of its own (a root server's room range), real, effective and
    // saved alike, as its receipt says; QEMU's own seccomp filter is on, as the arguments ask.
    let vmm_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids: Vec<u32> = vmm_status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap()
        .split_whitespace()
        .map(|u| u.parse().unwrap())
        .collect();
    let receipt = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await;
    let host_uid = receipt["receipt"]["host_uid"].as_u64().unwrap();
    assert!(
        uids[..3].iter().all(|u| u64::from(*u) == host_uid),
        "{uids:?} vs the receipt's {host_uid}"
    );
    if as_root {
        assert!(
            (0x7000_0000..0x7001_0000).contains(&host_uid),
            "a root server's VMM runs as a room uid, not {host_uid}"
        );
    }
    assert!(
        vmm_status.lines().any(|l| l == "Seccomp:\t2"),
        "QEMU runs under its seccomp filter: {vmm_status}"
    );
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let at = args
        .iter()
        .position(|a| *a == b"-sandbox")
        .expect("-sandbox");
    assert!(
        args[at + 1].starts_with(b"on,obsolete=deny,elevateprivileges=deny,spawn=deny"),
        "{}",
        String::from_utf8_lossy(args[at + 1])
    );
    if let Some((limit, peak)) = cgroup {
        assert!(
            limit == (256 + 320) << 20,
            "the VMM's limit is the guest's RAM plus 320 MiB: {limit}"
        );
        assert!(peak <= limit, "peak {peak} within limit {limit}");
    }

    // Stop (snapshot, then the disk is kept), restart the server, resume: the VM boots from
    // its own disk (the same file, not a restored copy: same inode) and the workspace is there.
    let inode = vm_exec(server, &t.ben, room, "stat -c %i /workspace/vm.txt").await["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(lifecycle(server, &t.ben, room, "stop").await.0, 200);
    assert!(vmm_pid(room).is_none(), "stopping ends the VMM");
    drop(editor);
    drop(typer);
    let Room {
        server,
        room,
        ana,
        ben,
        ..
    } = t;
    assert!(server.terminate().await.success());
    let vms = storage.dir.path().join("vms");
    let left: Vec<_> = std::fs::read_dir(&vms)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(left, ["kept"], "no VM's own directory outlives it");
    let kept = vms.join("kept").join(&room);
    assert!(kept.join("workspace.img").is_file() && kept.join("kept.json").is_file());
    let server = Server::start(&storage, &flags).await;
    let out = vm_exec(
        &server,
        &ben,
        &room,
        "cat /workspace/vm.txt /workspace/notes.txt; stat -c %i /workspace/vm.txt",
    )
    .await;
    assert!(!kept.exists(), "what was kept is now the running VM's");
    let starts: Vec<Value> = audit(&server, &ana, &room)
        .await
        .into_iter()
        .filter(|r| r["action"] == "sandbox_start" || r["action"] == "sandbox_stop")
        .map(|r| details(&r))
        .collect();
    let stop = starts.iter().rev().find(|d| d["kept"].is_string()).unwrap();
    assert_eq!(stop["kept"], "disk", "{starts:?}");
    assert!(stop["kept_bytes"].as_u64() > Some(3_000_000), "{stop}");
    let last = starts.last().unwrap();
    assert_eq!(last["resumed_from_kept"], "disk", "{starts:?}");
    assert_eq!(
        out["stdout"],
        format!("made-in-the-vm\nwritten in the editor\n{inode}"),
        "{out}"
    );

    let out = vm_exec(&server, &ben, &room, "md5sum < /workspace/big.bin").await;
    assert_eq!(
        out["stdout"].as_str().unwrap(),
        big_sum,
        "the big file came back whole"
    );

    // kill -9 of the VMM: participants are told; a restart resumes from the last snapshot
    // (nothing was kept: a crash leaves no disk to trust).
    let mut watcher = term(&server, &room, &ana).await;
    watcher.output_contains("$").await;
    let pid = vmm_pid(&room).expect("the VMM process");
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    watcher
        .until("told the sandbox failed", |t| {
            t.events.iter().any(|e| {
                e["type"] == "exit"
                    && e["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("VMM process was killed by signal 9"))
            })
        })
        .await;
    assert_eq!(lifecycle(&server, &ana, &room, "start").await.0, 200);
    let out = vm_exec(&server, &ben, &room, "cat /workspace/vm.txt").await;
    assert_eq!(out["stdout"], "made-in-the-vm\n", "{out}");
    let restarted = audit(&server, &ana, &room).await;
    let last = restarted
        .iter()
        .rev()
        .find(|r| r["action"] == "sandbox_start")
        .map(details)
        .unwrap();
    assert!(last["resumed_from_kept"].is_null(), "{last}");
    assert!(last["resumed_from"].is_string(), "{last}");

    // Stopped again, so the room has a kept disk when it is deleted.
    assert_eq!(lifecycle(&server, &ana, &room, "stop").await.0, 200);
    assert!(kept.join("workspace.img").is_file());

    // Deleting the room: the VM, its disk and the snapshots are gone, and the receipt says so.
    let receipt = delete_room(&server, &ana, &root, &room).await;
    let artifacts = receipt["receipt"]["artifacts"].as_array().unwrap().clone();
    let artifact = |name: &str| {
        artifacts
            .iter()
            .find(|a| a["artifact"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        artifact("sandbox")["status"],
        "none",
        "stopped before: {receipt}"
    );
    assert_eq!(artifact("vm_disks")["status"], "destroyed", "{receipt}");
    assert_eq!(artifact("vm_disks")["count"], 1, "the kept disk: {receipt}");
    assert_eq!(artifact("workspace")["status"], "destroyed", "{receipt}");
    assert!(
        artifact("workspace")["count"].as_i64() >= Some(1),
        "{receipt}"
    );
    assert!(vmm_pid(&room).is_none());
    let left: Vec<_> = std::fs::read_dir(&vms)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(left, ["kept"], "no VM disk is left: {left:?}");
    let kept_left = std::fs::read_dir(vms.join("kept")).unwrap().count();
    assert_eq!(kept_left, 0, "nothing is kept for the deleted room");
    assert!(!storage.dir.path().join("rooms").join(&room).exists());
}

/// An audit record's details as JSON.
fn details(r: &Value) -> Value {
    match &r["details"] {
        Value::String(s) => serde_json::from_str(s).expect("details are JSON"),
        d => d.clone(),
    }
}

/// `--sandbox-keep memory`: a stop saves the guest's memory beside its disk, and the next start
/// carries on from it instead of booting: the terminal's shell keeps its variables, a process
/// started before the stop still runs, and the guest's clock is the host's again.
#[tokio::test]
async fn a_vm_stopped_with_its_memory_carries_on() {
    let Some((image, _)) = guest_image() else {
        return;
    };
    let storage = Storage::new(&Backend::Sqlite).await;
    let mut flags = qemu_flags(&image);
    flags.extend(["--sandbox-keep".to_owned(), "memory".to_owned()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let t = team_with(&storage, &flags).await;
    carries_on_from_memory(&storage, &t).await;
}

/// Stops `t`'s room (a server with `--sandbox-keep memory`) with a shell variable set and a
/// process running, starts it again, and checks that both are there, the guest's clock was set,
/// and the audit says what was kept and resumed.
async fn carries_on_from_memory(storage: &Storage, t: &Room) {
    let (server, room) = (&t.server, &t.room);
    vm_exec(server, &t.ben, room, "echo > /workspace/before.txt").await;

    let mut typer = term(server, room, &t.ben).await;
    let pid = leave_a_shell_running(&mut typer, "forty42").await;
    drop(typer);

    assert_eq!(lifecycle(server, &t.ben, room, "stop").await.0, 200);
    assert!(vmm_pid(room).is_none(), "stopping ends the VMM");
    let kept = storage.dir.path().join("vms").join("kept").join(room);
    // One file under QEMU, a directory of the snapshot's files under cloud-hypervisor.
    assert!(kept.join("memory.bin").exists() && kept.join("workspace.img").is_file());

    assert_eq!(lifecycle(server, &t.ana, room, "start").await.0, 200);
    let mut typer = term(server, room, &t.ben).await;
    typer
        .send(
            format!("echo again-$X; kill -0 {pid} && echo alive-{pid}; echo now=$(date +%s)=\n")
                .as_bytes(),
        )
        .await;
    typer.output_contains(&format!("alive-{pid}")).await;
    // `now=DIGITS=` is the command's output (its echo reads `now=$(date +%s)=`).
    let printed = |t: &Term| -> Option<u64> {
        t.output
            .split("now=")
            .filter_map(|r| r.split('=').next()?.parse().ok())
            .next()
    };
    typer
        .until("the guest's time", |t| printed(t).is_some())
        .await;
    assert!(typer.output.contains("again-forty42"), "{}", typer.output);
    let guest_now = printed(&typer).expect("the guest's time");
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    assert!(
        host_now.abs_diff(guest_now) <= 30,
        "the guest's clock was set: guest {guest_now}, host {host_now}"
    );
    let out = vm_exec(server, &t.ben, room, "ls /workspace").await;
    assert!(
        out["stdout"]
            .as_str()
            .expect("stdout")
            .contains("before.txt"),
        "{out}"
    );

    let records = audit(server, &t.ana, room).await;
    let lifecycle_details: Vec<Value> = records
        .iter()
        .filter(|r| r["action"] == "sandbox_start" || r["action"] == "sandbox_stop")
        .map(details)
        .collect();
    let stop = lifecycle_details
        .iter()
        .rev()
        .find(|d| d["kept"].is_string())
        .expect("a stop that kept something");
    assert_eq!(stop["kept"], "memory", "{lifecycle_details:?}");
    assert_eq!(
        lifecycle_details.last().expect("a start")["resumed_from_kept"],
        "memory",
        "{lifecycle_details:?}"
    );
}

/// cloud-hypervisor's binary, or `None` after reporting the skip.
fn cloud_hypervisor() -> Option<PathBuf> {
    let bin = std::env::var_os("CODEROOM_CLOUD_HYPERVISOR_BIN")
        .map(PathBuf::from)
        .or_else(|| which("cloud-hypervisor"));
    if bin.is_none() {
        skip(
            Need::CloudHypervisor,
            "cloud-hypervisor is not installed (../shared/vendor/cloud-hypervisor/build.sh)",
        );
    }
    bin
}

/// A cloud-hypervisor answering its API with a VM created from the guest image and a workspace
/// disk (checked on the way: ping, a refusal read as one, create, info, delete, create again),
/// or `None` after reporting the test skipped.
#[allow(clippy::unwrap_used)]
async fn cloud_hypervisor_with_a_vm() -> Option<(
    tokio::process::Child,
    coderoom_sandbox::vm::ch::Api,
    tempfile::TempDir,
)> {
    use coderoom_sandbox::vm::ch::{vm_config, Api, ApiError};
    let bin = cloud_hypervisor()?;
    let (image, _) = guest_image()?;
    let hash = std::fs::read_to_string(image.join("current")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let api_path = dir.path().join("api.sock");
    let vmm = cloud_hypervisor_with_api(&bin, &api_path);
    let api = Api::new(&api_path);
    let ping = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match api.ping().await {
                Ok(p) => return p,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("cloud-hypervisor answers vmm.ping");
    assert!(ping.version.contains("54."), "{ping:?}");

    // Before a VM exists, vm.info is a refusal with the VMM's status, not a transport error.
    match api.info().await {
        Err(ApiError::Refused { status, .. }) => assert!(status >= 400, "{status}"),
        other => panic!("vm.info before vm.create: {other:?}"),
    }
    let disk = dir.path().join("workspace.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let img = image.join(hash.trim());
    let config = vm_config(
        &img.join("vmlinuz").display().to_string(),
        &img.join("initramfs.cpio").display().to_string(),
        &disk.display().to_string(),
        &dir.path().join("vsock.sock").display().to_string(),
        256 << 20,
        1,
        64,
    );
    api.create(&config).await.expect("vm.create");
    let info = api.info().await.expect("vm.info");
    assert_eq!(info.state, "Created");
    assert_eq!(info.config["memory"]["size"], 256u64 << 20);
    assert!(info.config["net"].is_null() || info.config["net"] == serde_json::json!([]));
    // Deleting a created VM and creating it again works.
    api.delete().await.expect("vm.delete of a created VM");
    api.create(&config).await.expect("vm.create again");

    Some((vmm, api, dir))
}

/// Whether `/dev/kvm` opens for reading and writing, as a VMM opens it.
fn kvm_opens() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// Ends `vmm` through its API and sees it exit cleanly.
#[allow(clippy::unwrap_used)]
async fn shut_down(mut vmm: tokio::process::Child, api: &coderoom_sandbox::vm::ch::Api) {
    api.delete().await.expect("vm.delete");
    api.shutdown_vmm(Duration::from_secs(5))
        .await
        .expect("vmm.shutdown");
    let status = tokio::time::timeout(Duration::from_secs(10), vmm.wait())
        .await
        .expect("the VMM exits after vmm.shutdown")
        .unwrap();
    assert!(status.success(), "{status}");
}

/// The driver's REST client against the real cloud-hypervisor: ping, create, info, delete, with
/// the guest image and a workspace disk, a refusal read as one, and the VMM shut down through
/// its API. Without KVM, `vm.boot` is a refusal. Whether a guest runs is
/// [`a_guest_boots_under_cloud_hypervisor`]'s.
#[tokio::test]
async fn the_cloud_hypervisor_api_against_the_real_binary() {
    use coderoom_sandbox::vm::ch::ApiError;
    let Some((vmm, api, _dir)) = cloud_hypervisor_with_a_vm().await else {
        return;
    };
    if !kvm_opens() {
        match api.boot().await {
            Err(ApiError::Refused { .. }) => {}
            other => panic!("vm.boot without KVM: {other:?}"),
        }
    }
    shut_down(vmm, &api).await;
}

/// A guest boots under cloud-hypervisor through the driver's client: `vm.boot`, then `vm.info`
/// reads it running (or shut down), and the VM is shut down and deleted. Where the guest cannot
/// run (no KVM, or a nested, software KVM), the VMM must say why in its log, and the test
/// reports itself skipped.
#[tokio::test]
async fn a_guest_boots_under_cloud_hypervisor() {
    if !kvm_opens() {
        skip(Need::Kvm, "/dev/kvm cannot be opened");
        return;
    }
    let Some((mut vmm, api, _dir)) = cloud_hypervisor_with_a_vm().await else {
        return;
    };
    api.boot().await.expect("vm.boot");
    // The guest may fail on a nested, software KVM: whether it runs is read from vm.info
    // (never from the VMM's exit code), and a VMM that ended must say why in its log.
    match api.info().await {
        Ok(info) => {
            assert!(
                ["Running", "Shutdown"].contains(&info.state.as_str()),
                "{}",
                info.state
            );
            let _ = api.shutdown().await;
            shut_down(vmm, &api).await;
        }
        Err(e) => {
            let _ = vmm.start_kill();
            let out = vmm.wait_with_output().await.unwrap();
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(!log.trim().is_empty(), "the VMM ended ({e}) without a word");
            skip(
                Need::Kvm,
                &format!("the guest did not run under this KVM: {e}; log: {log}"),
            );
        }
    }
}

/// `auto` boots a real probe guest under cloud-hypervisor before picking it. Where the guest
/// cannot reach its agent (a nested, software KVM such as this project's CI hosts), the probe
/// is stopped at its deadline, the VMM's own log is in the reason, nothing is left running,
/// and `auto` falls back to the namespace tier. Where it boots (hardware KVM, or
/// `CODEROOM_KVM_TESTS=1`), a room runs in a cloud-hypervisor guest end to end.
///
/// `vmm_pid` must see the probe's cloud-hypervisor while it runs, or "none left" proves
/// nothing. Shown failing once on purpose: with `vmm_pid` made QEMU-only again,
/// `CODEROOM_TEST_IMAGE_DIR=... cargo test -p coderoom-server --test microvm -- auto_picks`
/// failed with `vmm_pid never saw the probe's cloud-hypervisor: {"/usr/bin/qemu-system-x86_64"}`.
#[tokio::test]
async fn auto_picks_cloud_hypervisor_only_when_a_guest_reaches_its_agent() {
    let Some(bin) = cloud_hypervisor() else {
        return;
    };
    let Some((image, release)) = guest_image() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    // What `vmm_pid` sees while the probes run: the "none left" check below means something
    // only if it finds a running cloud-hypervisor at all (it once knew only QEMU).
    let probing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let probing = probing.clone();
        tokio::spawn(async move {
            let mut seen = std::collections::BTreeSet::new();
            while probing.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(pid) = vmm_pid("probe") {
                    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
                        seen.insert(exe.display().to_string());
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            seen
        })
    };
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_coderoom"))
            .arg("doctor")
            .arg("--data-dir")
            .arg(data.path())
            .arg("--image-dir")
            .arg(&image)
            .arg("--cloud-hypervisor-bin")
            .arg(&bin)
            .env("CODEROOM_LOG", "error")
            .output(),
    )
    .await
    .expect("doctor finishes: every probe has a deadline")
    .unwrap();
    probing.store(false, std::sync::atomic::Ordering::Relaxed);
    let seen = watcher.await.unwrap();
    assert!(
        seen.iter().any(|exe| exe.ends_with("cloud-hypervisor")),
        "vmm_pid never saw the probe's cloud-hypervisor: {seen:?}"
    );
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("cloud-hypervisor: yes: v54"), "{text}");
    let because = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("because: "))
        .unwrap_or_else(|| panic!("{text}"))
        .to_owned();
    let forced = std::env::var("CODEROOM_KVM_TESTS").as_deref() == Ok("1");
    if text.contains("auto picks: microvm") {
        assert!(
            because.contains("cloud-hypervisor") || because.contains("qemu"),
            "{because}"
        );
        assert!(because.contains("reached its agent"), "{because}");
    } else {
        assert!(
            !forced,
            "CODEROOM_KVM_TESTS=1, but no guest booted: {because}"
        );
        assert!(text.contains("auto picks: namespace"), "{text}");
        assert!(
            because.contains("cloud-hypervisor: a probe guest did not reach its agent"),
            "{because}"
        );
        // The VMM's own account is part of the reason.
        assert!(
            because.contains("the VMM's log: cloud-hypervisor") || because.contains("exited"),
            "{because}"
        );
        // Two probes (cloud-hypervisor, then QEMU with KVM), each stopped at its deadline.
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{:?}",
            started.elapsed()
        );
        let left = std::fs::read_dir(data.path().join("vms"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(left, 0, "a failed probe leaves no disk");
        assert!(vmm_pid("probe").is_none(), "no probe VMM is left running");
        skip(
            Need::Kvm,
            &format!("no guest reaches its agent under KVM on this host: {because}"),
        );
        return;
    }

    // A room on cloud-hypervisor: the guest's kernel answers.
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team_with(
        &storage,
        &[
            "--sandbox-tier",
            "microvm",
            "--vmm",
            "cloud-hypervisor",
            "--cloud-hypervisor-bin",
            bin.to_str().unwrap(),
            "--sandbox-memory-mb",
            "256",
            "--image-dir",
            image.to_str().unwrap(),
            "--sandbox-keep",
            "memory",
        ],
    )
    .await;
    let out = vm_exec(&t.server, &t.ben, &t.room, "uname -r; ls /sys/class/net").await;
    assert_eq!(out["stdout"], format!("{release}\nlo\n"), "{out}");
    let status = get_json(&t.server, &t.ana, &format!("/api/rooms/{}/sandbox", t.room)).await;
    assert_eq!(
        status["receipt"]["vm"]["vmm"], "cloud-hypervisor",
        "{status}"
    );
    // Stopped with its memory (vm.snapshot), started again (vm.restore): the agent is reached
    // over a new vsock connection and the guest carries on.
    carries_on_from_memory(&storage, &t).await;
}

/// A tiny PVH guest for cloud-hypervisor (an ELF with Xen's PHYS32 entry note): it writes the
/// letters A to Z, over and over, to the serial port, with a pause between letters. What it
/// prints after a restore shows whether it carried on from where it was saved.
fn letters_guest(path: &Path) {
    const BASE: u32 = 0x10_0000;
    let code: [u8; 24] = [
        0xB0,
        b'A', // mov al, 'A'
        0x66,
        0xBA,
        0xF8,
        0x03, // next: mov dx, 0x3f8
        0xEE, // out dx, al
        0xFE,
        0xC0, // inc al
        0x3C,
        b'Z' + 1, // cmp al, 'Z' + 1
        0x75,
        0x02, // jne wait
        0xB0,
        b'A', // mov al, 'A'
        0xB9,
        0x00,
        0x00,
        0x04,
        0x00, // wait: mov ecx, 0x40000
        0xE2,
        0xFE, // loop $
        0xEB,
        0xEA, // jmp next
    ];
    let mut note = Vec::new();
    for v in [4u32, 4, 18] {
        note.extend(v.to_le_bytes()); // namesz, descsz, XEN_ELFNOTE_PHYS32_ENTRY
    }
    note.extend(b"Xen\0");
    note.extend(BASE.to_le_bytes());
    let (ehsize, phsize) = (64u64, 56u64);
    let code_at = ehsize + 2 * phsize;
    let note_at = code_at + code.len() as u64;
    let mut elf = Vec::new();
    elf.extend(b"\x7fELF\x02\x01\x01\0");
    elf.extend([0u8; 8]);
    elf.extend(2u16.to_le_bytes()); // ET_EXEC
    elf.extend(0x3Eu16.to_le_bytes()); // x86-64
    elf.extend(1u32.to_le_bytes());
    elf.extend(u64::from(BASE).to_le_bytes()); // entry
    elf.extend(ehsize.to_le_bytes()); // program headers
    elf.extend(0u64.to_le_bytes()); // no sections
    elf.extend(0u32.to_le_bytes());
    for v in [ehsize as u16, phsize as u16, 2, 64, 0, 0] {
        elf.extend(v.to_le_bytes());
    }
    let phdr = |kind: u32, flags: u32, at: u64, addr: u64, len: u64, align: u64| {
        let mut h = Vec::new();
        h.extend(kind.to_le_bytes());
        h.extend(flags.to_le_bytes());
        for v in [at, addr, addr, len, len, align] {
            h.extend(v.to_le_bytes());
        }
        h
    };
    elf.extend(phdr(
        1,
        7,
        code_at,
        u64::from(BASE),
        code.len() as u64,
        0x1000,
    )); // PT_LOAD
    elf.extend(phdr(4, 4, note_at, 0, note.len() as u64, 4)); // PT_NOTE
    elf.extend(code);
    elf.extend(note);
    std::fs::write(path, elf).expect("the guest written");
}

/// The letters a cloud-hypervisor process's serial output holds, as they come, until `enough`
/// says so or its output ends.
async fn letters(
    out: &mut tokio::process::ChildStdout,
    seen: &mut String,
    enough: impl Fn(&str) -> bool,
) {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 256];
    while !enough(seen) {
        let n = tokio::time::timeout(Duration::from_secs(60), out.read(&mut buf))
            .await
            .expect("the guest prints")
            .expect("the VMM's output");
        if n == 0 {
            return;
        }
        seen.extend(
            buf[..n]
                .iter()
                .filter(|b| b.is_ascii_uppercase())
                .map(|&b| b as char),
        );
    }
}

fn cloud_hypervisor_with_api(bin: &Path, api: &Path) -> tokio::process::Child {
    tokio::process::Command::new(bin)
        .arg("--api-socket")
        .arg(format!("path={}", api.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cloud-hypervisor runs")
}

async fn answering(api: &coderoom_sandbox::vm::ch::Api) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while api.ping().await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("cloud-hypervisor answers vmm.ping");
}

/// The memory keep of the cloud-hypervisor driver against the real binary: a running guest is
/// paused and saved (`vm.snapshot`), the VMM ends, the saved machine and its disk move (as a
/// park moves them), its configuration is pointed at a new VMM's disk and vsock socket, and
/// `vm.restore` runs it on: the next letter it prints follows the last one before the save.
/// Where this host's KVM cannot save a vCPU (the nested, software KVM of this project's CI
/// hosts refuses KVM_GET_NESTED_STATE), the refusal must be the VMM's own words, nothing is
/// left, and the test reports the rest skipped (`Need::Kvm`).
#[tokio::test]
async fn cloud_hypervisor_saves_a_running_machine_and_restores_it_elsewhere() {
    use coderoom_sandbox::vm::ch::{repoint, save_memory, vm_config, Api};
    let Some(bin) = cloud_hypervisor() else {
        return;
    };
    if !kvm_opens() {
        skip(Need::Kvm, "/dev/kvm cannot be opened");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("letters.elf");
    letters_guest(&kernel);
    let config = |disk: &Path, vsock: &Path| {
        let mut c = vm_config(
            &kernel.display().to_string(),
            "",
            &disk.display().to_string(),
            &vsock.display().to_string(),
            128 << 20,
            1,
            64,
        );
        // The letters guest takes nothing but itself.
        c.payload.initramfs = None;
        c.payload.cmdline = None;
        c
    };
    let first = dir.path().join("first");
    std::fs::create_dir(&first).unwrap();
    let disk = first.join("workspace.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut vmm = cloud_hypervisor_with_api(&bin, &first.join("api.sock"));
    let api = Api::new(&first.join("api.sock"));
    answering(&api).await;
    api.create(&config(&disk, &first.join("vsock.sock")))
        .await
        .expect("vm.create");
    api.boot().await.expect("vm.boot");
    let mut out = vmm.stdout.take().unwrap();
    let mut before = String::new();
    letters(&mut out, &mut before, |s| s.len() >= 3).await;
    assert!(before.starts_with("ABC"), "the guest runs: {before:?}");

    let saved = first.join("memory.bin");
    let forced = std::env::var("CODEROOM_KVM_TESTS").as_deref() == Ok("1");
    match save_memory(&api, &saved, None, Duration::from_secs(120)).await {
        Ok(bytes) => assert!(bytes >= 128 << 20, "the whole memory is saved: {bytes}"),
        Err(why) => {
            let why = why.to_string();
            assert!(!forced, "CODEROOM_KVM_TESTS=1, but the save failed: {why}");
            assert!(
                why.contains("vm.snapshot") && why.contains("snapshot"),
                "{why}"
            );
            assert!(!why.contains("Stack backtrace"), "{why}");
            assert!(!saved.exists(), "a failed save leaves nothing");
            api.shutdown_vmm(Duration::from_secs(5)).await.unwrap();
            skip(
                Need::Kvm,
                &format!("this host's KVM cannot save a running guest: {why}"),
            );
            return;
        }
    }
    assert_eq!(api.info().await.unwrap().state, "Paused");
    api.shutdown_vmm(Duration::from_secs(5)).await.unwrap();
    letters(&mut out, &mut before, |_| false).await;
    vmm.wait().await.unwrap();
    let last = before.chars().last().unwrap();

    // Moved, as a park keeps it, then restored by a new VMM with its own sockets.
    let second = dir.path().join("second");
    std::fs::create_dir(&second).unwrap();
    std::fs::rename(&saved, second.join("memory.bin")).unwrap();
    std::fs::rename(&disk, second.join("workspace.img")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();
    let saved = second.join("memory.bin");
    repoint(
        &saved,
        &config(&second.join("workspace.img"), &second.join("vsock.sock")),
    )
    .unwrap();
    let mut vmm = cloud_hypervisor_with_api(&bin, &second.join("api.sock"));
    let api = Api::new(&second.join("api.sock"));
    answering(&api).await;
    api.restore(&saved, true, Duration::from_secs(120))
        .await
        .expect("vm.restore");
    assert_eq!(api.info().await.unwrap().state, "Running");
    let mut out = vmm.stdout.take().unwrap();
    let mut after = String::new();
    letters(&mut out, &mut after, |s| !s.is_empty()).await;
    let next = if last == 'Z' {
        'A'
    } else {
        (last as u8 + 1) as char
    };
    assert!(
        after.starts_with(next),
        "the restored guest carries on: {last:?} before the save, {after:?} after"
    );
    api.shutdown_vmm(Duration::from_secs(5)).await.unwrap();
    vmm.wait().await.unwrap();
}

/// The VM tier's figures for `docs/benchmarks.md`, measured in one run on this machine (QEMU
/// with software emulation; cloud-hypervisor where a guest boots under KVM):
/// create-to-agent-ready beside the bare kernel + initramfs boot floor (the same kernel and an
/// `/init` that powers off at once), stop (snapshot) and resume (boot + restore) with a 16 MiB
/// workspace, memory of an idle VM, and a shell loop in the guest beside the same busybox on the
/// host. `cargo test --release -p coderoom-server --test microvm -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn bench_vm() {
    use coderoom_sandbox::proto::{Op, Reply};
    use coderoom_sandbox::vm::{choose, Accel, Inputs, VmConfig, VmmKind};
    use coderoom_sandbox::{Keep, Limits};
    let Some((image, _)) = guest_image() else {
        return;
    };
    let runs = knob("BENCH_RUNS", 5);
    // BENCH_VMM=cloud-hypervisor on a host where its guests boot (hardware KVM).
    let ch = std::env::var("BENCH_VMM").as_deref() == Ok("cloud-hypervisor");
    let ch_bin = if ch {
        Some(cloud_hypervisor().expect("BENCH_VMM=cloud-hypervisor needs its binary"))
    } else {
        None
    };
    let state = tempfile::tempdir().unwrap();
    let cfg = VmConfig {
        vmm: Some(if ch {
            VmmKind::CloudHypervisor
        } else {
            VmmKind::Qemu
        }),
        accel: Some(if ch { Accel::Kvm } else { Accel::Tcg }),
        cloud_hypervisor_bin: ch_bin.clone(),
        qemu_bin: None,
        image_dir: image.clone(),
        state_dir: state.path().join("vms"),
        inputs: Inputs::default(),
        build_on_need: false,
    };
    let (vm, why) = choose(&cfg, false).await.expect("the VM tier");
    eprintln!("{why}");
    let limits = Limits {
        memory_bytes: 512 << 20,
        pids: 512,
        cpu_millis: 1000,
        workspace_bytes: 256 << 20,
    };
    let hash = std::fs::read_to_string(image.join("current")).unwrap();
    let img = image.join(hash.trim());

    // The floor: the same kernel, an initramfs whose /init powers off at once.
    let floor_dir = tempfile::tempdir().unwrap();
    let floor_initrd = floor_dir.path().join("floor.cpio");
    {
        let root = floor_dir.path().join("root");
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        std::fs::write(
            root.join("init"),
            "#!/bin/busybox sh\n/bin/busybox poweroff -f\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root.join("init"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cd {} && find . | busybox cpio -o -H newc > {}",
                root.display(),
                floor_initrd.display()
            ))
            .status()
            .unwrap();
        assert!(status.success());
    }
    let floor = || {
        let t0 = std::time::Instant::now();
        if let Some(bin) = &ch_bin {
            let status = std::process::Command::new(bin)
                .arg("--kernel")
                .arg(img.join("vmlinuz"))
                .arg("--initramfs")
                .arg(&floor_initrd)
                .args(["--cmdline", "console=ttyS0 quiet panic=-1"])
                .args(["--memory", "size=512M", "--cpus", "boot=1"])
                .args(["--serial", "null", "--console", "off"])
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success());
            return t0.elapsed();
        }
        let status = std::process::Command::new("qemu-system-x86_64")
            .args([
                "-M",
                "q35",
                "-accel",
                "tcg,tb-size=64",
                "-cpu",
                "max",
                "-m",
                "512M",
            ])
            .args([
                "-nodefaults",
                "-no-user-config",
                "-no-reboot",
                "-display",
                "none",
                "-nic",
                "none",
            ])
            .arg("-kernel")
            .arg(img.join("vmlinuz"))
            .arg("-initrd")
            .arg(&floor_initrd)
            .args(["-append", "console=ttyS0 quiet panic=-1"])
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        t0.elapsed()
    };

    let exec = |sb: coderoom_sandbox::Sandbox, script: &'static str| async move {
        let r = sb
            .call(
                Op::Exec {
                    argv: vec!["sh".into(), "-c".into(), script.into()],
                    cwd: String::new(),
                    timeout_ms: 600_000,
                    max_output: 1 << 16,
                    actor: String::new(),
                },
                Duration::from_secs(600),
            )
            .await
            .expect("exec");
        let Reply::Exec {
            exit_code, stdout, ..
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(exit_code, Some(0));
        String::from_utf8_lossy(&stdout).into_owned()
    };

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut ready, mut floors, mut stops, mut resumes, mut rss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut park_disk, mut resume_disk, mut park_memory, mut resume_memory) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut kept_disk_bytes, mut kept_memory_bytes) = (0, 0);
    let mut snapshot_bytes = 0;
    for i in 0..runs {
        floors.push(ms(floor()));
        eprintln!("run {i}: floor");
        let t0 = std::time::Instant::now();
        let (sb, _ev, _r) = vm
            .start(&format!("bench{i}"), &limits)
            .await
            .expect("start");
        ready.push(ms(t0.elapsed()));
        eprintln!("run {i}: ready");
        exec(
            sb.clone(),
            "head -c 16777216 /dev/urandom > /workspace/blob && mkdir -p /workspace/src && \
             for f in 1 2 3 4 5 6 7 8 9 10; do echo file $f > /workspace/src/f$f.txt; done",
        )
        .await;
        // Idle memory: the VMM's resident set once the guest settles.
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(pid) = vmm_pid(&format!("bench{i}")) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let kb: f64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0.0);
            rss.push(kb / 1024.0);
        }
        // Stop: the snapshot, then the VM ends.
        let snap = state.path().join(format!("snap{i}.tar"));
        let t0 = std::time::Instant::now();
        let mut f = tokio::fs::File::create(&snap).await.unwrap();
        snapshot_bytes = sb
            .snapshot(&mut f, 1 << 30, Duration::from_secs(600))
            .await
            .unwrap();
        sb.kill();
        let _ = sb.ended().await;
        stops.push(ms(t0.elapsed()));
        eprintln!("run {i}: stopped");
        // Resume: a new VM, the snapshot restored into its disk.
        let t0 = std::time::Instant::now();
        let (sb, _ev, _r) = vm
            .start(&format!("resume{i}"), &limits)
            .await
            .expect("start");
        let mut f = tokio::fs::File::open(&snap).await.unwrap();
        sb.restore(&mut f, Duration::from_secs(600)).await.unwrap();
        resumes.push(ms(t0.elapsed()));
        eprintln!("run {i}: resumed");
        let back = exec(
            sb.clone(),
            "cat /workspace/src/f7.txt; wc -c < /workspace/blob",
        )
        .await;
        assert_eq!(back, "file 7\n16777216\n");
        // Stop keeping the disk, then resume booting from it (nothing restored); then stop
        // keeping its memory too, and carry on from it (no boot).
        let name = format!("resume{i}");
        let mut sb = sb;
        for (keep, parks, resumes, kept_bytes, check) in [
            (
                Keep::Disk,
                &mut park_disk,
                &mut resume_disk,
                &mut kept_disk_bytes,
                ("cat /workspace/src/f7.txt", "file 7\n"),
            ),
            (
                Keep::Memory,
                &mut park_memory,
                &mut resume_memory,
                &mut kept_memory_bytes,
                ("wc -c < /workspace/blob", "16777216\n"),
            ),
        ] {
            let t0 = std::time::Instant::now();
            let parked = sb
                .park(keep, keep.name(), Duration::from_secs(600))
                .await
                .expect("park");
            parks.push(ms(t0.elapsed()));
            assert_eq!(parked.kept, keep, "{parked:?}");
            *kept_bytes = parked.bytes;
            let t0 = std::time::Instant::now();
            let (resumed, _ev, _r) = vm
                .resume(&name, &limits, Some(keep.name()))
                .await
                .expect("resume");
            resumes.push(ms(t0.elapsed()));
            sb = resumed;
            assert_eq!(sb.resumed().map(|r| r.from), Some(keep));
            assert_eq!(exec(sb.clone(), check.0).await, check.1);
            eprintln!("run {i}: resumed from its {}", keep.name());
        }
        sb.kill();
        let _ = sb.ended().await;
    }

    // The same shell loop in the guest and on the host (the same busybox).
    const LOOP: &str = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo $i";
    let (sb, _ev, _r) = vm.start("loop", &limits).await.expect("start");
    let t0 = std::time::Instant::now();
    assert_eq!(exec(sb.clone(), LOOP).await, "200000\n");
    let guest_loop = ms(t0.elapsed());
    sb.kill();
    let _ = sb.ended().await;
    let t0 = std::time::Instant::now();
    let out = std::process::Command::new("/bin/busybox")
        .args(["sh", "-c", LOOP])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200000\n");
    let host_loop = ms(t0.elapsed());

    println!(
        "| figure ({}, {runs} runs, median) | value |",
        if ch {
            "cloud-hypervisor, KVM"
        } else {
            "QEMU 7.2, software emulation"
        }
    );
    println!("|---|---|");
    println!(
        "| bare kernel + initramfs boot floor (spawn to poweroff) | {:.0} ms |",
        median(floors)
    );
    println!(
        "| VM create to agent ready (disk made, boot, modules, mount, agent hello) | {:.0} ms |",
        median(ready)
    );
    println!(
        "| stop: snapshot ({} KiB) then the VM ends | {:.0} ms |",
        snapshot_bytes / 1024,
        median(stops)
    );
    println!(
        "| resume: new VM to agent ready + restore | {:.0} ms |",
        median(resumes)
    );
    println!(
        "| stop keeping the disk: agent quiesced (sync), VMM ends, disk moved aside ({} MiB on the host) | {:.0} ms |",
        kept_disk_bytes >> 20,
        median(park_disk)
    );
    println!(
        "| resume from the kept disk: boot to agent ready, nothing restored | {:.0} ms |",
        median(resume_disk)
    );
    println!(
        "| stop keeping memory too: guest paused, RAM and devices saved, synced (disk + memory {} MiB) | {:.0} ms |",
        kept_memory_bytes >> 20,
        median(park_memory)
    );
    println!(
        "| resume from memory: saved machine loaded, agent answers, every process still running | {:.0} ms |",
        median(resume_memory)
    );
    println!(
        "| VMM resident memory of an idle VM (512 MiB guest) | {:.0} MiB |",
        median(rss)
    );
    println!("| shell loop, 200,000 iterations: guest / host | {guest_loop:.0} ms / {host_loop:.0} ms ({:.1}x) |", guest_loop / host_loop);
}
