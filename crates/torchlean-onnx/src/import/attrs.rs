//! A node's attributes, read by name with the ONNX default, and every attribute the mapping
//! did not read reported: an attribute torchlean does not understand is never ignored.

use crate::constant::Const;
use onnx_protobuf::{attribute_proto::AttributeType, AttributeProto, NodeProto};
use std::cell::RefCell;
use std::collections::BTreeSet;

pub struct Attrs<'a> {
    node: &'a NodeProto,
    read: RefCell<BTreeSet<String>>,
}

type Read<T> = Result<T, String>;

impl<'a> Attrs<'a> {
    pub fn new(node: &'a NodeProto) -> Attrs<'a> {
        Attrs {
            node,
            read: RefCell::new(BTreeSet::new()),
        }
    }

    fn get(&self, name: &str, want: AttributeType) -> Read<Option<&'a AttributeProto>> {
        self.read.borrow_mut().insert(name.to_string());
        match self.node.attribute.iter().find(|a| a.name == name) {
            None => Ok(None),
            Some(a) if a.type_.value() == want as i32 => Ok(Some(a)),
            Some(a) => Err(format!(
                "attribute `{name}` has type code {}, expected {want:?}",
                a.type_.value()
            )),
        }
    }

    pub fn int(&self, name: &str, default: i64) -> Read<i64> {
        Ok(self.get(name, AttributeType::INT)?.map_or(default, |a| a.i))
    }

    pub fn float(&self, name: &str, default: f32) -> Read<f32> {
        Ok(self
            .get(name, AttributeType::FLOAT)?
            .map_or(default, |a| a.f))
    }

    pub fn ints(&self, name: &str) -> Read<Option<Vec<i64>>> {
        Ok(self.get(name, AttributeType::INTS)?.map(|a| a.ints.clone()))
    }

    /// A STRINGS attribute (GRU/LSTM `activations`), each decoded as UTF-8 (lossily).
    pub fn strings(&self, name: &str) -> Read<Option<Vec<String>>> {
        Ok(self.get(name, AttributeType::STRINGS)?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }

    pub fn string(&self, name: &str, default: &str) -> Read<String> {
        Ok(self
            .get(name, AttributeType::STRING)?
            .map_or(default.to_string(), |a| {
                String::from_utf8_lossy(&a.s).into_owned()
            }))
    }

    pub fn tensor(&self, name: &str) -> Read<Option<&'a onnx_protobuf::TensorProto>> {
        Ok(self
            .get(name, AttributeType::TENSOR)?
            .and_then(|a| a.t.as_ref()))
    }

    /// The one value attribute of a `Constant` node, as a tensor.
    pub fn constant_value(&self) -> Read<Const> {
        let a = match self.node.attribute.as_slice() {
            [a] => a,
            _ => return Err("a Constant node needs exactly one value attribute".into()),
        };
        self.read.borrow_mut().insert(a.name.clone());
        let ty = a.type_.value();
        match a.name.as_str() {
            "value" if ty == AttributeType::TENSOR as i32 => match a.t.as_ref() {
                Some(t) => Const::from_proto(t),
                None => Err("the `value` attribute holds no tensor".into()),
            },
            "value_float" if ty == AttributeType::FLOAT as i32 => Ok(Const::f32(vec![], vec![a.f])),
            "value_floats" if ty == AttributeType::FLOATS as i32 => {
                Ok(Const::f32(vec![a.floats.len()], a.floats.clone()))
            }
            "value_int" if ty == AttributeType::INT as i32 => Ok(Const {
                dims: vec![],
                data: crate::constant::Data::I64(vec![a.i]),
            }),
            "value_ints" if ty == AttributeType::INTS as i32 => Ok(Const::i64s(a.ints.clone())),
            other => Err(format!(
                "Constant attribute `{other}` (type code {ty}) is not supported"
            )),
        }
    }

    /// How many outputs the node names.
    pub fn output_count(&self) -> usize {
        self.node.output.len()
    }

    /// Names of attributes present on the node that the mapping never read.
    pub fn unread(&self) -> Vec<String> {
        let read = self.read.borrow();
        self.node
            .attribute
            .iter()
            .filter(|a| !read.contains(&a.name))
            .map(|a| a.name.clone())
            .collect()
    }
}
