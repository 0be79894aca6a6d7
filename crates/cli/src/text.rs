//! Text renderings of admin answers (the `--json` forms are the values).

use crate::size::human;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

fn b(v: &Value) -> String {
    human(v.as_u64().unwrap_or(0))
}

/// A volume answer's name and human-readable size.
pub fn name_and_size(v: &Value) -> (String, String) {
    (v["name"].as_str().unwrap_or("?").to_string(), b(&v["size"]))
}

pub fn status(v: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "pool {}", v["uuid"].as_str().unwrap_or("?"));
    let _ = writeln!(s, "  size       {} ({} bytes)", b(&v["size"]), v["size"]);
    let _ = writeln!(s, "  used       {} ({} bytes)", b(&v["used"]), v["used"]);
    let _ = writeln!(s, "  free       {} ({} bytes)", b(&v["free"]), v["free"]);
    let _ = writeln!(s, "  reserved   {} (kept for metadata)", b(&v["reserved"]));
    let _ = writeln!(s, "  metadata   {} ({} bytes)", b(&v["metadata"]), v["metadata"]);
    let _ = writeln!(
        s,
        "  volumes    {} ({} virtual, overcommit {:.2}x)",
        v["volumes"],
        b(&v["virtual_size"]),
        v["overcommit_ratio"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(
        s,
        "  placement  {}{}",
        v["placement"].as_str().unwrap_or("?"),
        if v["strict"] == true { ", strict" } else { "" }
    );
    for d in v["devices"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "  device {}  {}  {} data, {} free",
            d["index"],
            d["path"].as_str().unwrap_or("?"),
            b(&d["data"]),
            b(&d["free"])
        );
    }
    for n in v["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  note: {}", n.as_str().unwrap_or(""));
    }
    s
}

pub fn check(v: &Value) -> String {
    let mut s = String::new();
    for n in v["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "note: {}", n.as_str().unwrap_or(""));
    }
    for p in v["problems"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "PROBLEM: {}", p.as_str().unwrap_or(""));
    }
    let verdict = if v["clean"] == true { "clean" } else { "PROBLEMS FOUND" };
    let _ = writeln!(
        s,
        "{verdict}: {} volumes, {} extents, {} mapped, {} free",
        v["volumes"],
        v["extents"],
        b(&v["mapped_bytes"]),
        b(&v["free_bytes"])
    );
    s
}

pub fn volumes(v: &Value) -> String {
    let mut s = format!("{:<24} {:>12} {:>12} {:>8}\n", "NAME", "SIZE", "ALLOCATED", "EXTENTS");
    for vol in v.as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "{:<24} {:>12} {:>12} {:>8}",
            vol["name"].as_str().unwrap_or("?"),
            b(&vol["size"]),
            b(&vol["allocated"]),
            vol["extents"]
        );
    }
    s
}

pub fn connect_hints(addr: &str, volume: &str, socket: &Path) -> String {
    let uri = format!("nbd://{addr}/{volume}");
    format!(
        "tarn: serving thin volume {volume}\n\
         \x20 NBD over TCP:   {uri}\n\
         \x20 NBD over unix:  nbd+unix:///{volume}?socket={sock}\n\
         Try:\n\
         \x20 nbdinfo {uri}\n\
         \x20 qemu-img info {uri}\n\
         \x20 qemu-io -f raw {uri} -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'\n\
         \x20 mkdir -p /mnt/tarn && nbdfuse /mnt/tarn {uri} &   # exposes /mnt/tarn/nbd\n\
         \x20 losetup -f --show /mnt/tarn/nbd && mkfs.ext4 /dev/loopN && mount /dev/loopN /mnt/x\n\
         \x20 nbd-client 127.0.0.1 {port} /dev/nbd0 -N {volume}   # where the kernel has nbd\n\
         Stop with Ctrl-C or SIGTERM: connections drain and the pool is committed.",
        sock = socket.display(),
        port = addr.rsplit(':').next().unwrap_or("10809"),
    )
}
