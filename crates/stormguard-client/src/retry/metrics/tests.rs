use super::*;

#[test]
fn methods_get_a_slot_each_and_the_rest_share_other() {
    let methods = Methods::new();
    let a = methods.index("/pkg.Svc/A");
    assert_eq!(methods.index("/pkg.Svc/A"), a);
    assert_ne!(methods.index("/pkg.Svc/B"), a);
    let name = methods.slots[a].name.get().expect("named");
    assert_eq!((&*name.0, &*name.1), ("pkg.Svc", "A"));
    for n in 0..2 * MAX_METHODS {
        methods.index(&format!("/pkg.Svc/M{n}"));
    }
    assert_eq!(methods.index("/pkg.Svc/Z"), MAX_METHODS, "_OTHER");
    assert_eq!(
        methods.index("/pkg.Svc/A"),
        a,
        "earlier methods keep their slot"
    );
}
