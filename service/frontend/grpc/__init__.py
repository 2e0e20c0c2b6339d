"""The gRPC edge: the Open Inference Protocol v2's GRPCInferenceService (`server`), its .proto and the code
generated from it (`generate`), and the one map from domain errors to gRPC status codes (`status`)."""
