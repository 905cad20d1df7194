use super::*;

fn key(namespace: &str, name: &str) -> ControllerKey {
    ControllerKey::parse(&format!("{namespace}/{name}"))
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn texts(read: &Read) -> Vec<&str> {
    read.lines.iter().map(|l| &*l.text).collect()
}

#[test]
fn keys_name_namespaced_and_cluster_controllers() {
    assert_eq!(
        ControllerKey::parse("team-x/hello"),
        ControllerKey {
            namespace: Some("team-x".into()),
            name: "hello".into()
        }
    );
    assert_eq!(ControllerKey::parse("admins").namespace, None);
}

#[test]
fn a_ring_keeps_its_newest_lines_within_its_cap() {
    let line_cost = 100 + LINE_OVERHEAD;
    let store = LogStore::new(MAX_LINE_BYTES + LINE_OVERHEAD, usize::MAX);
    let x = key("team-x", "a");
    for i in 0..1000 {
        store.push(&x, at(i), &format!("{i:0100}"));
    }
    let cap = MAX_LINE_BYTES + LINE_OVERHEAD;
    assert!(store.ring_bytes(&x) <= cap, "{}", store.ring_bytes(&x));
    assert!(store.ring_bytes(&x) > cap - line_cost);
    assert_eq!(store.used(Some("team-x")), store.ring_bytes(&x));
    let read = store.read(&x, Selection::default()).unwrap();
    assert_eq!(
        read.lines.last().unwrap().text.as_ref(),
        format!("{:0100}", 999)
    );
    assert_eq!(read.next, 1000);
    assert_eq!(read.lines.len(), cap / line_cost);
}

#[test]
fn a_namespace_shares_its_cap_and_the_largest_ring_gives_way() {
    let least = MAX_LINE_BYTES + LINE_OVERHEAD;
    let store = LogStore::new(2 * least, 2 * least);
    let (quiet, loud, other) = (
        key("team-x", "quiet"),
        key("team-x", "loud"),
        key("team-y", "b"),
    );
    for i in 0..10 {
        store.push(&quiet, at(i), "a quiet line");
        store.push(&other, at(i), "another team's line");
    }
    for i in 0..10_000 {
        store.push(&loud, at(i), &"x".repeat(200));
    }
    assert!(store.used(Some("team-x")) <= 2 * least);
    let quiet_read = store.read(&quiet, Selection::default()).unwrap();
    assert_eq!(
        quiet_read.lines.len(),
        10,
        "the loud ring gave way, not the quiet one"
    );
    assert_eq!(
        store
            .read(&other, Selection::default())
            .unwrap()
            .lines
            .len(),
        10,
        "another namespace is untouched"
    );
    assert_eq!(
        store.used(Some("team-x")),
        store.ring_bytes(&quiet) + store.ring_bytes(&loud)
    );
}

#[test]
fn since_tail_and_after_select_lines() {
    let store = LogStore::default();
    let x = key("team-x", "a");
    for i in 0..10 {
        store.push(&x, at(i), &format!("line {i}"));
    }
    let since = store
        .read(
            &x,
            Selection {
                since: Some(at(7)),
                ..Selection::default()
            },
        )
        .unwrap();
    assert_eq!(texts(&since), ["line 7", "line 8", "line 9"]);
    let tail = store
        .read(
            &x,
            Selection {
                tail: Some(2),
                ..Selection::default()
            },
        )
        .unwrap();
    assert_eq!(texts(&tail), ["line 8", "line 9"]);
    let both = store
        .read(
            &x,
            Selection {
                since: Some(at(8)),
                tail: Some(5),
                ..Selection::default()
            },
        )
        .unwrap();
    assert_eq!(texts(&both), ["line 8", "line 9"]);
    let after = store
        .read(
            &x,
            Selection {
                from: Some(9),
                ..Selection::default()
            },
        )
        .unwrap();
    assert_eq!((texts(&after), after.missed), (vec!["line 9"], 0));
    assert!(
        store
            .read(&key("team-x", "b"), Selection::default())
            .is_none()
    );
    assert!(
        store
            .read(&key("team-y", "a"), Selection::default())
            .is_none()
    );
}

#[test]
fn a_reader_behind_the_ring_is_told_what_it_missed() {
    let least = MAX_LINE_BYTES + LINE_OVERHEAD;
    let store = LogStore::new(least, usize::MAX);
    let x = key("team-x", "a");
    for i in 0..1000 {
        store.push(&x, at(i), &"y".repeat(100));
    }
    let read = store
        .read(
            &x,
            Selection {
                from: Some(10),
                ..Selection::default()
            },
        )
        .unwrap();
    let first = read.lines.first().unwrap().seq;
    assert_eq!(read.missed, first - 10);
    assert!(read.missed > 900);
}

#[test]
fn long_lines_are_cut_saying_so() {
    let store = LogStore::default();
    let x = key("team-x", "a");
    store.push(&x, at(0), &"é".repeat(MAX_LINE_BYTES));
    let read = store.read(&x, Selection::default()).unwrap();
    let text = &read.lines[0].text;
    assert!(text.len() <= MAX_LINE_BYTES, "{}", text.len());
    assert!(
        text.ends_with("more bytes)"),
        "{}",
        &text[text.len() - 30..]
    );
}

#[test]
fn forgetting_gives_the_bytes_back_and_ends_followers() {
    let store = LogStore::default();
    let x = key("team-x", "a");
    let mut rx = store.watch(&x);
    store.push(&x, at(0), "hello");
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), 1);
    store.forget(&x);
    assert_eq!(store.used(Some("team-x")), 0);
    assert!(
        rx.has_changed().is_err(),
        "the follower's channel is closed"
    );
    assert!(store.read(&x, Selection::default()).is_none());
}

#[test]
fn rendered_lines_carry_their_time() {
    let line = Line {
        seq: 0,
        at: at(0),
        text: "INFO guest: hi".into(),
    };
    assert_eq!(line.render(), "2027-01-15T08:00:00.000Z INFO guest: hi\n");
}
