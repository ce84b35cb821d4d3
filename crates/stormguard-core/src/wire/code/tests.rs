use super::*;
use proptest::prelude::*;

#[test]
fn numbers_and_names_round_trip() {
    for (i, code) in Code::ALL.iter().enumerate() {
        assert_eq!(code.as_i32(), i as i32);
        assert_eq!(Code::from_i32(i as i32), Some(*code));
        assert_eq!(code.name().parse::<Code>(), Ok(*code));
        assert_eq!(code.name().to_lowercase().parse::<Code>(), Ok(*code));
    }
    assert_eq!(Code::from_i32(17), None);
    assert_eq!(Code::from_i32(-1), None);
}

#[test]
fn rejects_unknown_names_and_numbers() {
    assert!("UNAVAILABLE_".parse::<Code>().is_err());
    assert!("17".parse::<Code>().is_err());
    assert!("".parse::<Code>().is_err());
    assert!("-3".parse::<Code>().is_err());
}

proptest! {
    #[test]
    fn parse_never_panics(s in ".{0,24}") {
        let _ = s.parse::<Code>();
    }

    #[test]
    fn set_holds_exactly_what_was_inserted(bits in proptest::collection::vec(any::<bool>(), 17)) {
        let chosen: Vec<Code> = Code::ALL.iter().zip(&bits).filter(|(_, b)| **b).map(|(c, _)| *c).collect();
        let set: CodeSet = chosen.iter().copied().collect();
        for (c, b) in Code::ALL.iter().zip(&bits) {
            prop_assert_eq!(set.contains(*c), *b);
        }
        prop_assert_eq!(set.iter().collect::<Vec<_>>(), chosen);
    }
}
