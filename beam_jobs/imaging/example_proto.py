"""The wire schema of ``tf.train.Example``, for workers that must not import TensorFlow.

Why not ``tensorflow.core.example.example_pb2``: importing it runs TensorFlow's package
initialiser, which took 8 s and hundreds of MB per process on the 2-core machine this project is
measured on. A conversion worker needs only the protobuf message layout, so this module declares
the same messages (same field numbers and types as TensorFlow's ``feature.proto`` and
``example.proto``) in a private descriptor pool, under a private package name so that nothing
clashes when TensorFlow is imported into the same process. ``tests/test_example.py`` checks that
the bytes are identical to TensorFlow's own ``tf.train.Example`` serialisation and that
``tf.io.parse_example`` reads them.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Example", "Feature", "Features"]

_PACKAGE = "images_to_tfrecords.wire"
_F = descriptor_pb2.FieldDescriptorProto


def _field(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    kind: int,
    *,
    repeated: bool = False,
    type_name: str = "",
    oneof: int | None = None,
    packed: bool = False,
) -> None:
    field = message.field.add(name=name, number=number, type=kind)
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        field.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof
    if packed:
        field.options.packed = True


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="images_to_tfrecords/wire/example.proto", package=_PACKAGE, syntax="proto3"
    )
    bytes_list = file.message_type.add(name="BytesList")
    _field(bytes_list, "value", 1, _F.TYPE_BYTES, repeated=True)
    float_list = file.message_type.add(name="FloatList")
    _field(float_list, "value", 1, _F.TYPE_FLOAT, repeated=True, packed=True)
    int64_list = file.message_type.add(name="Int64List")
    _field(int64_list, "value", 1, _F.TYPE_INT64, repeated=True, packed=True)

    feature = file.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    _field(feature, "bytes_list", 1, _F.TYPE_MESSAGE, type_name="BytesList", oneof=0)
    _field(feature, "float_list", 2, _F.TYPE_MESSAGE, type_name="FloatList", oneof=0)
    _field(feature, "int64_list", 3, _F.TYPE_MESSAGE, type_name="Int64List", oneof=0)

    features = file.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name="Feature")
    _field(features, "feature", 1, _F.TYPE_MESSAGE, repeated=True, type_name="Features.FeatureEntry")

    example = file.message_type.add(name="Example")
    _field(example, "features", 1, _F.TYPE_MESSAGE, type_name="Features")
    return file


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_file())
Feature = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.Feature"))
Features = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.Features"))
Example = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.Example"))
