//! Holds the Rust side of `bpf/include/cheetah_shared.h` equal to the C side: compiles a
//! host program that prints each constant, size and field offset of the header as C sees
//! it, and compares them with the Rust items that mirror them. Every name the header
//! defines must be checked here, so neither side can change, nor the header grow, unseen.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use super::meta::{RawMeta, FIB_NO_NEIGH, FIB_OK, FROM_SERVER, MAGIC, META_LEN, TO_VIP};
use super::xdp::{
    BackendKey, MAX_HOST_ADDRS, MAX_INTERFACES, MAX_QUEUES, STAT_NO_METADATA_ROOM, STAT_NO_SOCKET,
    STAT_PASSED, STAT_TO_SOCKET,
};

const HEADER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../bpf/include/cheetah_shared.h"
);

/// Names of the header with no Rust counterpart, and why none is needed.
const C_ONLY: &[(&str, &str)] = &[
    ("CHEETAH_SHARED_H", "the include guard"),
    (
        "META_FIB_FAILED",
        "userspace takes every next hop that is neither FIB_OK nor FIB_NO_NEIGH as unroutable",
    ),
];

fn field_size<S, F>(_field: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

/// C expression -> the value the Rust side has for it.
fn rust_side() -> BTreeMap<String, u64> {
    let stats = [
        STAT_TO_SOCKET,
        STAT_NO_SOCKET,
        STAT_PASSED,
        STAT_NO_METADATA_ROOM,
    ];
    let values: Vec<(&str, usize)> = vec![
        ("MAX_QUEUES", MAX_QUEUES as usize),
        ("MAX_INTERFACES", MAX_INTERFACES),
        ("MAX_HOST_ADDRS", MAX_HOST_ADDRS),
        ("META_MAGIC", MAGIC as usize),
        ("META_TO_VIP", TO_VIP as usize),
        ("META_FROM_SERVER", FROM_SERVER as usize),
        ("META_FIB_OK", FIB_OK as usize),
        ("META_FIB_NO_NEIGH", FIB_NO_NEIGH as usize),
        ("sizeof(struct cheetah_meta)", META_LEN),
        (
            "offsetof(struct cheetah_meta, magic)",
            offset_of!(RawMeta, magic),
        ),
        (
            "offsetof(struct cheetah_meta, flags)",
            offset_of!(RawMeta, flags),
        ),
        (
            "offsetof(struct cheetah_meta, ifindex)",
            offset_of!(RawMeta, ifindex),
        ),
        (
            "offsetof(struct cheetah_meta, dmac)",
            offset_of!(RawMeta, dmac),
        ),
        (
            "offsetof(struct cheetah_meta, smac)",
            offset_of!(RawMeta, smac),
        ),
        (
            "fieldsize(struct cheetah_meta, magic)",
            field_size(|m: &RawMeta| &m.magic),
        ),
        (
            "fieldsize(struct cheetah_meta, flags)",
            field_size(|m: &RawMeta| &m.flags),
        ),
        (
            "fieldsize(struct cheetah_meta, ifindex)",
            field_size(|m: &RawMeta| &m.ifindex),
        ),
        (
            "fieldsize(struct cheetah_meta, dmac)",
            field_size(|m: &RawMeta| &m.dmac),
        ),
        (
            "fieldsize(struct cheetah_meta, smac)",
            field_size(|m: &RawMeta| &m.smac),
        ),
        ("STAT_TO_SOCKET", STAT_TO_SOCKET as usize),
        ("STAT_NO_SOCKET", STAT_NO_SOCKET as usize),
        ("STAT_PASSED", STAT_PASSED as usize),
        ("STAT_NO_METADATA_ROOM", STAT_NO_METADATA_ROOM as usize),
        ("STAT_COUNT", stats.len()),
        ("sizeof(struct backend_key)", size_of::<BackendKey>()),
        (
            "offsetof(struct backend_key, addr)",
            offset_of!(BackendKey, addr),
        ),
        (
            "offsetof(struct backend_key, port)",
            offset_of!(BackendKey, port),
        ),
        (
            "offsetof(struct backend_key, pad)",
            offset_of!(BackendKey, pad),
        ),
        (
            "fieldsize(struct backend_key, addr)",
            field_size(|k: &BackendKey| &k.addr),
        ),
        (
            "fieldsize(struct backend_key, port)",
            field_size(|k: &BackendKey| &k.port),
        ),
        (
            "fieldsize(struct backend_key, pad)",
            field_size(|k: &BackendKey| &k.pad),
        ),
    ];
    values
        .into_iter()
        .map(|(name, value)| (name.to_string(), value as u64))
        .collect()
}

/// What the header declares, as the C expressions that must be checked: each `#define`,
/// each enum member, and each struct's size and its fields' offsets and sizes.
fn declared(header: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside: Option<String> = None;
    for line in header.lines() {
        let code = line.split("//").next().unwrap().trim();
        if let Some(define) = code.strip_prefix("#define ") {
            names.push(define.split_whitespace().next().unwrap().to_string());
        } else if let Some(open) = code.strip_suffix('{') {
            let open = open.trim();
            if open.starts_with("struct ") {
                names.push(format!("sizeof({open})"));
            }
            inside = Some(open.to_string());
        } else if code.starts_with('}') {
            inside = None;
        } else if let (Some(block), false) = (&inside, code.is_empty()) {
            if block.starts_with("enum ") {
                names.push(code.trim_end_matches(',').trim().to_string());
            } else {
                let declarator = code
                    .trim_end_matches(';')
                    .split_whitespace()
                    .last()
                    .unwrap();
                let field = declarator.split('[').next().unwrap();
                names.push(format!("offsetof({block}, {field})"));
                names.push(format!("fieldsize({block}, {field})"));
            }
        }
    }
    names
}

/// Compiles a host program against the header and returns what it prints for each name.
fn c_side(names: &[String]) -> BTreeMap<String, u64> {
    let dir = tempfile::tempdir().unwrap();
    let include = Path::new(HEADER).parent().unwrap();
    let mut program = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"cheetah_shared.h\"\n\
         #define fieldsize(type, field) sizeof(((type *)0)->field)\n\
         int main(void)\n{\n",
    );
    for name in names {
        program +=
            &format!("\tprintf(\"%s\\t%llu\\n\", \"{name}\", (unsigned long long)({name}));\n");
    }
    program += "\treturn 0;\n}\n";
    let source = dir.path().join("layout.c");
    let binary = dir.path().join("layout");
    std::fs::write(&source, program).unwrap();
    // The C compiler scripts/setup.sh installs (build-essential).
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let compiled = Command::new(&cc)
        .args(["-Wall", "-Werror", "-I"])
        .arg(include)
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc} ({e}); run scripts/setup.sh"));
    assert!(
        compiled.status.success(),
        "{cc} cannot build a program with {HEADER}:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&binary).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.split_once('\t').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn c_and_rust_agree_on_the_shared_layouts() {
    let header = std::fs::read_to_string(HEADER).unwrap();
    let rust = rust_side();
    let names: Vec<String> = declared(&header)
        .into_iter()
        .filter(|name| !C_ONLY.iter().any(|(c_only, _)| c_only == name))
        .collect();
    let unmirrored: Vec<&String> = names.iter().filter(|n| !rust.contains_key(*n)).collect();
    assert!(
        unmirrored.is_empty(),
        "{HEADER} declares {unmirrored:?}, which no Rust item mirrors: add them to rust_side \
         (or to C_ONLY, saying why userspace needs none)"
    );
    let stale: Vec<&String> = rust.keys().filter(|n| !names.contains(n)).collect();
    assert!(stale.is_empty(), "{HEADER} no longer declares {stale:?}");
    let c = c_side(&names);
    let disagreements: Vec<String> = names
        .iter()
        .filter(|name| c.get(*name) != rust.get(*name))
        .map(|name| format!("{name}: C {:?}, Rust {:?}", c.get(name), rust.get(name)))
        .collect();
    assert!(
        disagreements.is_empty(),
        "C and Rust disagree:\n{}",
        disagreements.join("\n")
    );
}
