//! Tenants ([`transfer::receiver::Tenant`]): one receiver, one port, a key per project, and each
//! key's sessions confined to that key's root and held to that key's limits.

use std::path::Path;

use transfer::auth::KeySetting;
use transfer::auth::SessionKey;
use transfer::job::{SendJob, SenderSettings};
use transfer::receiver::{
    Access, Receiver, ReceiverEvent, ReceiverSettings, SessionOutcome, Tenant,
};
use transfer::sender::{grant, SendError, SendOptions, SendSource};
use transfer::wire::Limit;

use crate::common::{contents, explain, paced, run, run_past, KEY};

const CLIMATE: &str = "climate-project-key-0123456789";
const ASTRO: &str = "astro-project-key-0123456789";

/// A tenant of `name` with `key`, under `root`.
fn tenant(name: &str, key: &str, root: &Path, max_sessions: usize) -> Tenant {
    Tenant::new(name, KeySetting::Text(key.into()), root.into()).max_sessions(max_sessions)
}

/// A job sending `source` to `addr` with `key`, into `dest`.
fn send(addr: &str, key: &str, source: &Path, rate: Option<u64>, dest: &str) -> SenderSettings {
    let mut settings = paced(addr, source.into(), rate);
    settings.key = KeySetting::Text(key.into());
    settings.source = SendSource::Paths {
        paths: vec![source.into()],
        destination: dest.into(),
    };
    settings
}

#[test]
fn each_key_lands_in_its_own_root_within_its_own_limits() {
    let site = tempfile::tempdir().unwrap();
    let roots: Vec<_> = ["ops", "climate", "astro"]
        .iter()
        .map(|name| site.path().join(name))
        .collect();
    roots
        .iter()
        .for_each(|r| std::fs::create_dir_all(r).unwrap());
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("run42.bin");
    let data = contents(7, 6 << 20);
    std::fs::write(&file, &data).unwrap();

    let mut settings = ReceiverSettings::new(roots[0].clone(), KeySetting::Text(KEY.into()));
    settings.listen = "127.0.0.1:0".into();
    settings.tenants = vec![
        tenant("climate", CLIMATE, &roots[1], 1),
        tenant("astro", ASTRO, &roots[2], 4),
    ];
    let receiver = Receiver::bind(&settings).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    let mut events = receiver.subscribe();
    std::thread::spawn(move || receiver.serve(None));

    // The same file from each key lands under that key's root only.
    for (key, root) in [(KEY, &roots[0]), (CLIMATE, &roots[1])] {
        let (_, result) = run(SendJob::start(send(&addr, key, &file, None, "")).unwrap());
        result.unwrap();
        assert!(std::fs::read(root.join("run42.bin")).unwrap() == data);
    }
    assert!(!roots[2].join("run42.bin").exists());

    // Two sessions of climate at once are over its limit; astro's own limit lets one through,
    // and it writes the same path under its own root as climate's session under climate's
    // without waiting for it.
    let slow = send(&addr, CLIMATE, &file, Some(2_000_000), "slow");
    let slow = SendJob::start(slow).unwrap();
    let (mut second, mut astro) = (None, None);
    let mut other = send(&addr, CLIMATE, &file, None, "again");
    let first = run_past(slow, 1 << 20, || {
        let job = SendJob::start(other.clone()).unwrap();
        second = Some(std::thread::spawn(move || run(job).1).join().unwrap());
        other = send(&addr, ASTRO, &file, None, "slow");
        let job = SendJob::start(other.clone()).unwrap();
        astro = Some(std::thread::spawn(move || run(job).1).join().unwrap());
        assert!(
            !roots[1].join("slow/run42.bin").exists(),
            "astro's session waited for climate's"
        );
    });
    first.unwrap();
    match second.unwrap() {
        Err(SendError::Limited {
            limit: Limit::TenantSessions { max: 1 },
            ..
        }) => {}
        other => panic!("a second climate session: {other:?}"),
    }
    astro.unwrap().unwrap();
    assert!(std::fs::read(roots[2].join("slow/run42.bin")).unwrap() == data);
    assert!(std::fs::read(roots[1].join("slow/run42.bin")).unwrap() == data);
    assert!(!roots[1].join("again").exists());

    // A destination that leaves the tenant's root is refused.
    let escape = send(&addr, ASTRO, &file, None, "../ops");
    let (_, result) = run(SendJob::start(escape).unwrap());
    assert!(
        matches!(result, Err(SendError::Receiver { .. })),
        "{result:?}"
    );

    // A key no tenant holds is refused.
    let (_, result) =
        run(SendJob::start(send(&addr, "nobodys-key-0123456789", &file, None, "")).unwrap());
    match result {
        Err(SendError::Auth { cause, .. }) => {
            assert!(
                cause.to_string().contains("does not hold this key"),
                "{cause}"
            )
        }
        other => panic!("an unknown key: {other:?}"),
    }

    // The events name the tenant of each session.
    let mut ended = Vec::new();
    while let Some(event) = events.try_next() {
        if let ReceiverEvent::SessionEnded(report) = event {
            ended.push((report.tenant, report.dest, report.outcome));
        }
    }
    let completed = |tenant: Option<&str>, dest: &str| {
        ended
            .iter()
            .any(|(t, d, o)| t.as_deref() == tenant && d == dest && *o == SessionOutcome::Completed)
    };
    assert!(completed(None, ""), "{ended:?}");
    assert!(completed(Some("climate"), ""), "{ended:?}");
    assert!(completed(Some("astro"), "slow"), "{ended:?}");
}

#[test]
fn tenants_with_one_key_a_missing_root_or_overlapping_roots_are_refused_at_start() {
    let site = tempfile::tempdir().unwrap();
    let mut settings = ReceiverSettings::new(site.path().into(), KeySetting::Text(KEY.into()));
    settings.listen = "127.0.0.1:0".into();
    settings.tenants = vec![tenant("copy", KEY, site.path(), 4)];
    let e = Receiver::bind(&settings).err().unwrap().to_string();
    assert!(e.contains("tenant copy has the key"), "{e}");
    settings.tenants = vec![tenant("lost", CLIMATE, &site.path().join("missing"), 4)];
    let e = Receiver::bind(&settings).err().unwrap().to_string();
    assert!(e.contains("missing"), "{e}");
    let inside = site.path().join("climate");
    std::fs::create_dir_all(&inside).unwrap();
    settings.tenants = vec![tenant("climate", CLIMATE, &inside, 4)];
    let e = Receiver::bind(&settings).err().unwrap().to_string();
    assert!(e.contains("overlap"), "{e}");
}

/// A one-time credential (`transfer::sender::grant`) lets another host send one session, to
/// the directory it was granted for and nowhere else under the key's root; a key that may only
/// read cannot grant one.
#[test]
fn a_one_time_credential_serves_one_session_to_its_directory() {
    let site = tempfile::tempdir().unwrap();
    let (own, archive) = (site.path().join("own"), site.path().join("archive"));
    std::fs::create_dir_all(&own).unwrap();
    std::fs::create_dir_all(&archive).unwrap();
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("run42.bin");
    let data = contents(9, 3 << 20);
    std::fs::write(&file, &data).unwrap();
    let mut settings = ReceiverSettings::new(own.clone(), KeySetting::Text(KEY.into()));
    settings.listen = "127.0.0.1:0".into();
    let reader = tenant("climate", CLIMATE, &archive, 4).access(Access::Read);
    settings.tenants = vec![reader];
    let receiver = Receiver::bind(&settings).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    let key = |text: &str| SessionKey::from_text(text).unwrap();
    let options = SendOptions::default();
    let with = |credential: &str, dest: &str| {
        let mut job = send(&addr, credential, &file, None, dest);
        job.key = KeySetting::Text(credential.into());
        run(SendJob::start(job).unwrap()).1.map_err(|e| explain(&e))
    };

    let credential = grant(&addr, key(KEY), "in/run42", &options).unwrap();
    assert_ne!(credential, KEY);
    let elsewhere = with(&credential, "other").unwrap_err();
    assert!(
        elsewhere.contains("for one session to \"in/run42\""),
        "{elsewhere}"
    );
    assert!(!own.join("other").exists());
    // Used up by the session it proved, refused or not: from then on no key it serves.
    let again = with(&credential, "in/run42").unwrap_err();
    assert!(again.contains("does not hold this key"), "{again}");

    let credential = grant(&addr, key(KEY), "in/run42", &options).unwrap();
    with(&credential, "in/run42").unwrap();
    assert_eq!(std::fs::read(own.join("in/run42/run42.bin")).unwrap(), data);
    let again = with(&credential, "in/run42").unwrap_err();
    assert!(again.contains("does not hold this key"), "{again}");

    let refused = grant(&addr, key(CLIMATE), "x", &options)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("may not send files here (its access is read)"),
        "{refused}"
    );
}
