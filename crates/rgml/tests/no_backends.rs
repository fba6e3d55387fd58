//! A program that opens a device before registering any backend gets an error that says what to
//! call, not "unknown device 'CPU' (available: )". Its own test binary: nothing registers here.

#[test]
fn opening_a_device_before_registering_says_what_to_call() {
    let err = rgml::registry::init_backend("CPU")
        .err()
        .expect("no backend is registered");
    assert!(
        matches!(&err, rgml::Error::NoBackendsRegistered { name } if name == "CPU"),
        "{err:?}"
    );
    assert!(err.to_string().contains("register()"), "{err}");
}
